"""Numbers in the units a person reads: durations, parameter counts, large counts."""
from __future__ import annotations


def format_duration(seconds: float) -> str:
    """A duration in the unit a person would use: 45 s, 12 min, 5.2 hours, 3.4 days, 449 years."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} hours"
    days = seconds / 86400
    if days <= 730:
        return f"{days:,.1f} days"
    return f"{days / 365:,.0f} years"


def human_params(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def count(x: float) -> str:
    return f"{x:,.0f}" if x < 1e9 else f"{x:.3g}"

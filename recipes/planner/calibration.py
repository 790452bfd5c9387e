"""Calibrations: the cost model's efficiency terms fitted to measured runs, stored per GPU or per cluster.

A calibration file (configs/clusters/calibration/NAME.yaml) holds the fitted terms, what they were fitted on and how
well, and is not itself a recipe:

    calibration:
      applies_to: h100          # a GPU family (cluster.gpu "H100-80GB" -> h100) or a cluster.name
      fitted_on: published      # published runs (recipes.planner.published) or this cluster's run directories
      terms: {kernel_efficiency: 0.61, ...}
      runs: [{name: ..., role: fit, measured: ..., predicted: ..., error: ...}, ...]

`assumptions_for(cluster)` finds the file for a cluster (its cluster.name first, then its GPU family) and applies
its terms; `fit` is the least-squares fit both the published calibration (docs/make_planner_doc.py --refit) and
`recipes plan --calibrate RUN_DIR...` use.
"""
from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, Sequence

import yaml

from recipes.config.loading import CONFIGS_DIR, RecipeError
from recipes.planner.assumptions import FITTED_TERMS, Assumptions

CALIBRATION_DIR = CONFIGS_DIR / "clusters" / "calibration"
# GPUs with the same compute as a family that has a calibration: the H200 is the H100's chip with more memory.
FAMILY_ALIASES = {"h200": "h100"}
# The range each term may take in a fit (physical: an efficiency in (0, 1], sizes and overheads non-negative).
BOUNDS = {"kernel_efficiency": (0.05, 0.95), "gemm_falloff": (0.0, 4096.0), "elementwise_hidden": (0.0, 16384.0),
          "attention_efficiency": (0.05, 0.75), "intra_link_efficiency": (0.01, 1.0),
          "inter_link_efficiency": (0.01, 1.0), "latency_intra_s": (0.0, 0.1), "latency_inter_s": (0.0, 0.1),
          "overlap_efficiency": (0.0, 1.0), "layer_overhead_s": (0.0, 1.0), "micro_batch_overhead_s": (0.0, 10.0),
          "step_overhead_s": (0.0, 600.0)}


def gpu_family(cluster) -> str:
    """'H100-80GB' -> 'h100', 'A100-40GB' -> 'a100', 'cpu' -> 'cpu': the chip, whatever its memory."""
    name = re.split(r"[-_ ]", cluster.gpu.strip().lower(), maxsplit=1)[0]
    return FAMILY_ALIASES.get(name, name)


@dataclass(frozen=True)
class Calibration:
    """Fitted terms and where they come from (the file, what they were fitted on), for the plan to state."""
    terms: dict
    path: Path | None
    applies_to: str
    fitted_on: str

    def describe(self) -> str:
        where = str(self.path.relative_to(CONFIGS_DIR.parent)) if self.path and self.path.is_relative_to(
            CONFIGS_DIR.parent) else str(self.path)
        return (f"efficiency terms from {where} (fitted on {self.fitted_on}): "
                + ", ".join(f"{k}={_fmt(v)}" for k, v in self.terms.items()))


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def read_calibration(path: str | Path) -> Calibration:
    """A calibration file, checked: one clear line naming the file and the field when it is not one."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such calibration file (make one with `recipes plan --calibrate RUN_DIR...`)")
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    section = doc.get("calibration") if isinstance(doc, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("terms"), dict):
        raise RecipeError(f"{path}: not a calibration file (it needs a calibration.terms mapping)")
    terms = section["terms"]
    unknown = sorted(set(terms) - set(FITTED_TERMS))
    if unknown:
        raise RecipeError(f"{path}: calibration.terms has {', '.join(unknown)}, not efficiency terms; known: "
                          + ", ".join(FITTED_TERMS))
    bad = [k for k, v in terms.items() if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0]
    if bad:
        raise RecipeError(f"{path}: calibration.terms.{bad[0]} must be a non-negative number, got {terms[bad[0]]!r}")
    return Calibration(terms={k: float(v) for k, v in terms.items()}, path=path,
                       applies_to=str(section.get("applies_to", "")), fitted_on=str(section.get("fitted_on", "?")))


def find_calibration(cluster, directory: Path = CALIBRATION_DIR) -> Path | None:
    """The calibration file for `cluster`: its own (cluster.name), else its GPU family's; None when neither exists."""
    for name in (cluster.name, gpu_family(cluster)):
        path = directory / f"{name}.yaml"
        if name and path.is_file():
            return path
    return None


def assumptions_for(cluster, base: Assumptions = Assumptions(), path: str | Path | None = None,
                    directory: Path = CALIBRATION_DIR) -> tuple[Assumptions, Calibration | None]:
    """`base` with the fitted terms of `path`, or of the cluster's calibration file when there is one."""
    found = Path(path) if path else find_calibration(cluster, directory)
    if found is None:
        return base, None
    cal = read_calibration(found)
    return replace(base, **cal.terms), cal


def write_calibration(path: Path, section: dict, header: str) -> None:
    """Write a calibration file atomically (a temporary file in the same directory, then one rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = header + yaml.safe_dump({"calibration": section}, sort_keys=False, width=118)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(name, 0o644)
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------------------
# The fit
# ---------------------------------------------------------------------------------------------------------------------

def fit(predict: Callable[[Assumptions], Sequence[float]], measured: Sequence[float], terms: Sequence[str],
        base: Assumptions, bounds: dict | None = None) -> Assumptions:
    """The values of `terms` (the rest of `base` kept) that minimise the squared log errors of `predict(assume)`
    against `measured`: every run weighs the same whatever its size, and an error of +10% costs what -10% does.
    `bounds` replaces some of BOUNDS."""
    try:
        from scipy.optimize import least_squares  # scipy is only needed to fit, not to plan
    except ImportError:
        raise RecipeError("fitting a calibration needs scipy (its least_squares); pip install scipy") from None

    unknown = [t for t in terms if t not in FITTED_TERMS]
    if unknown:
        raise ValueError(f"not efficiency terms: {unknown}")
    limits = {**BOUNDS, **(bounds or {})}
    lo = [limits[t][0] for t in terms]
    hi = [limits[t][1] for t in terms]
    start = [min(max(float(getattr(base, t)), a), b) for t, a, b in zip(terms, lo, hi, strict=True)]
    scale = [max(abs(x), 1e-6) for x in start]

    def residuals(x) -> list[float]:
        assume = replace(base, **dict(zip(terms, x, strict=True)))
        return [math.log(p / m) for p, m in zip(predict(assume), measured, strict=True)]

    result = least_squares(residuals, start, bounds=(lo, hi), x_scale=scale, diff_step=1e-3, xtol=1e-6, ftol=1e-8)
    return replace(base, **{t: float(v) for t, v in zip(terms, result.x, strict=True)})


def fitted_terms(assume: Assumptions, terms: Sequence[str]) -> dict:
    names = {f.name for f in fields(assume)}
    return {t: round(float(getattr(assume, t)), 6) for t in terms if t in names}

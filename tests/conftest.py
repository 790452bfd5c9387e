"""Every test belongs to exactly one tier (pytest.ini lists them): a test without one would silently fall out of
`pytest -m unit` and of every tier, so collection refuses it."""
from __future__ import annotations

import pytest

TIERS = ("unit", "multiproc", "ssh", "gpu")


def pytest_collection_modifyitems(config, items):
    wrong = []
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: tiers {tiers or 'none'}")
    if wrong:
        raise pytest.UsageError("each test needs exactly one tier marker (pytestmark = pytest.mark.unit / multiproc "
                                "/ ssh / gpu):\n  " + "\n  ".join(wrong))

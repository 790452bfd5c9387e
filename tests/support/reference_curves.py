"""Pinned loss curves of the 1-process runs that the parity tests compare every layout against
(tests/assets/reference_curves.json): a change that moves the 1-process run itself (initialisation, data order, the
loss, the optimizer, the schedule) moves every layout with it, so the parity tests alone cannot see it.

Each pinned run records its overrides (without the paths), the digest of the corpus it read, and its per-step training
and validation losses. `assert_follows_pinned` checks that a test's reference run is still that run (same overrides,
same corpus), then compares each loss within REL_TOL.

REL_TOL = 1e-4 relative, per step. What it must pass: the same code on another CPU, which sums in another order
(vector width, blocking of the matrix kernels, the vectorised exp/log): the README's 200-step demo gave 4.848 here and
4.847 on an AMD EPYC VM, 2e-4 apart after 200 steps; these curves are 4-8 steps, and reordered sums over such a run
(a TP/CP/DP layout vs one process) move the losses by <= 3.3e-7 (test_sequence_context_parallel.py), so 1e-4 is
300x that noise. What it catches (measured on the 8-step tiny run): a 1% larger learning rate moves the loss by
1.3e-4 at step 2 and 1.9e-3 at step 8; a changed initialisation, data order or loss mask moves it by 1e-2 or more
from step 1. Smaller changes (eps 1e-8 -> 1e-7: 2e-5; weight decay +10%: 2e-6) stay below it: the parity tests and
the optimizer test (tests/recipes/test_guarded_adamw.py) cover the optimizer's arithmetic.

To re-pin after an intended change: run the reference tests with PIN_REFERENCE_CURVES=1 (they then write their
curves instead of comparing), e.g. `PIN_REFERENCE_CURVES=1 python -m pytest -p no:xdist -k pinned tests/training`,
and commit the JSON with the reason.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from tests.support.runs import losses, val_losses

CURVES = Path(__file__).resolve().parents[1] / "assets" / "reference_curves.json"
REL_TOL = 1e-4
ABOUT = ("Per-step losses of the 1-process runs the parity tests compare against, pinned; compared within 1e-4 "
         "relative. Made and checked by tests/support/reference_curves.py (the tolerance and why, how to re-pin).")


def corpus_digest(manifest: Path) -> str:
    """sha256 over the corpus's shards (the corpus is the running Python's standard library: it changes with it)."""
    h = hashlib.sha256()
    for shard in sorted(Path(manifest).parent.glob("*.bin")):
        h.update(shard.name.encode())
        h.update(shard.read_bytes())
    return h.hexdigest()


def _record(run_dir: Path, manifest: Path, overrides: list[str]) -> dict:
    return {"overrides": list(overrides), "corpus_sha256": corpus_digest(manifest),
            "python": ".".join(map(str, sys.version_info[:3])),
            "loss": {str(s): v for s, v in sorted(losses(run_dir).items())},
            "val_loss": {str(s): v for s, v in sorted(val_losses(run_dir).items())}}


def assert_follows_pinned(name: str, run_dir: Path, manifest: Path, overrides: list[str]) -> None:
    got = _record(run_dir, manifest, overrides)
    pinned = json.loads(CURVES.read_text()) if CURVES.exists() else {}
    if os.environ.get("PIN_REFERENCE_CURVES") == "1":
        pinned[name] = got
        pinned["_about"] = ABOUT
        CURVES.write_text(json.dumps(dict(sorted(pinned.items())), indent=1) + "\n")
        return
    assert name in pinned, f"no pinned curve '{name}' in {CURVES}; pin it with PIN_REFERENCE_CURVES=1"
    want = pinned[name]
    assert got["overrides"] == want["overrides"], (
        f"{name}: the reference run's overrides {got['overrides']} are not the pinned run's {want['overrides']}; "
        "re-pin with PIN_REFERENCE_CURVES=1 (tests/support/reference_curves.py)")
    assert got["corpus_sha256"] == want["corpus_sha256"], (
        f"{name}: the test corpus (Python {got['python']}'s standard library) is not the one the curve was pinned on "
        f"(Python {want['python']}); its losses cannot be compared: re-pin with PIN_REFERENCE_CURVES=1")
    for kind in ("loss", "val_loss"):
        assert sorted(got[kind], key=int) == sorted(want[kind], key=int), (name, kind, got[kind], want[kind])
        worst = max((abs(got[kind][s] - want[kind][s]) / abs(want[kind][s]) for s in want[kind]), default=0.0)
        assert worst <= REL_TOL, (
            f"{name}: the 1-process {kind} curve moved from the pinned one by {worst:.2e} relative (tolerance "
            f"{REL_TOL:g}): {got[kind]} vs pinned {want[kind]}")

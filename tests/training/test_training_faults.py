"""A step with a non-finite loss or gradient is skipped (the weights stay as they were), counted and logged; too many
in a row stop the run with a clear message and a non-zero exit."""
from __future__ import annotations

import pytest

from tests.support.runs import on_corpus, pretrain, train_records

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("zero_stage", [0, 1, 3])  # ZeRO-1 skips inside DeepSpeed; ZeRO-0/3 via our guard too
def test_non_finite_steps_are_skipped_then_abort(zero_stage, corpus, tmp_path):
    # lr = 1e30: the first update blows the weights up, every later gradient overflows to inf.
    out = pretrain(1, *on_corpus(tmp_path, corpus), f"parallel.zero_stage={zero_stage}", "training.optimizer.lr=1e30",
                   "training.optimizer.min_lr=0", "training.max_consecutive_nan_skips=3", "training.train_steps=12",
                   check=False)
    assert out.returncode != 0
    assert "3 consecutive steps had a non-finite loss or gradient" in out.stderr, out.stderr[-3000:]
    assert "update skipped" in out.stderr, out.stderr[-3000:]  # a logged event
    records = train_records(tmp_path)  # the step records, not the start-of-run layout record
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # stopped at the limit, not at train_steps
    assert [r["skipped"] for r in records] == [False, True, True, True]
    assert [r["nan_skips_total"] for r in records] == [0, 1, 2, 3]
    # Skipped means skipped: the weights did not change, so the next steps see the same loss.
    assert records[2]["loss"] == records[3]["loss"]

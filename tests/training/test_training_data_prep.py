"""End to end on data_prep's own output: its demo (real stdlib text -> sentencepiece tokenizer -> shards ->
manifest.json) feeds a TP=2 training run; the loss falls from the uniform level log(V)."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from tests.support.runs import on_corpus, REPO, pretrain, train_records, worker_env

pytestmark = pytest.mark.multiproc


def test_loss_falls_on_data_prep_shards(tmp_path):
    out = tmp_path / "prep"
    subprocess.run([sys.executable, "-m", "data_prep", "demo", str(out), "-j", "2", "--corpus-mb", "1",
                    "--vocab-size", "1000", "-q"], cwd=REPO, env=worker_env(), check=True, capture_output=True,
                   timeout=300)
    manifest = out / "shards" / "manifest.json"
    run = tmp_path / "run"
    pretrain(2, *on_corpus(run, manifest), "model.vocab_size=1000", "training.train_steps=10", "parallel.tp=2")
    loss = [r["loss"] for r in train_records(run)]
    assert len(loss) == 10
    assert abs(loss[0] - math.log(1000)) < 0.5  # starts near uniform over the tokenizer's vocabulary
    assert loss[-1] < loss[0] - 0.4, loss

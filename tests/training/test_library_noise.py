"""No per-rank library noise (issue 26, item 4): DeepSpeed's "Setting accelerator to CPU", printed by every process
that imports it on a machine without a GPU, is dropped (recipes.config.logs.LIBRARY_NOISE); the one case it would
have flagged, a GPU recipe where torch sees no GPU, is said once by the train command instead."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.runs import REPO, on_corpus, pretrain, worker_env

pytestmark = pytest.mark.multiproc

NOISE = "Setting accelerator to CPU"


def test_deepspeed_still_says_it_unfiltered():
    """The reference: a bare import, with no GPU visible, prints the line (else the test below would prove nothing)."""
    r = subprocess.run([sys.executable, "-c", "import deepspeed"], cwd=REPO, env=worker_env(), capture_output=True,
                       text=True, timeout=300)
    assert NOISE in r.stdout + r.stderr


def test_a_two_rank_run_prints_no_library_noise_and_names_a_missing_gpu_once(corpus, tmp_path):
    r = pretrain(2, *on_corpus(tmp_path, corpus), "training.train_steps=2", "cluster.device=cuda",
                 fresh=True)  # import-time noise shows only in a fresh interpreter
    out = r.stdout + r.stderr
    assert NOISE not in out, out[-3000:]
    assert out.count("cluster.device = cuda but torch sees no GPU here") == 1, out[-3000:]
    assert (tmp_path / "global_step2" / "complete.json").is_file()  # and it trained, on CPU

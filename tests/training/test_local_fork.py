"""`recipes train --local N` forks its ranks from a pre-imported template (recipes.train.local_ranks): the template must
be safe to fork (one thread, no CUDA) once everything is imported, else the fork path silently falls back and the
speed-up is gone; and forked ranks must train exactly like fresh interpreters (RECIPES_LOCAL_START=exec)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.runs import REPO, losses, on_corpus, pretrain, worker_env

pytestmark = pytest.mark.multiproc

PROBE = """
import os
os.environ.setdefault("OMP_NUM_THREADS", "1"); os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
from recipes.train.cli import _before_rank_imports
from recipes.train.local_ranks import TEMPLATE_MODULES, prepare_template, thread_count
import sys
_before_rank_imports()  # what a fresh rank does first (data_prep.lazy_compile): megatron-core's fusions and
import deepspeed.runtime.zero.muon.muon_optimizer  # DeepSpeed's Muon steps stay uncompiled, the compiler unimported
from megatron.core.fusions.fused_bias_geglu import geglu
print("rank imports the compiler:", "torch._inductor.compile_fx" in sys.modules, "fusions deferred:",
      hasattr(geglu, "__wrapped__"), "logging libraries:",  # megatron-core's optional imports, hidden
      any(m in sys.modules for m in ("wandb", "torch.utils.tensorboard")))
print("problem:", prepare_template(lambda: None))  # the template: the rest, torch's compiler included, for its forks
print("threads:", thread_count())
print("imported:", all(m in sys.modules for m in TEMPLATE_MODULES + ("torch", "deepspeed", "megatron.core")))
"""


def test_template_imports_everything_and_stays_single_threaded():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=worker_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-5:-1] == ["rank imports the compiler: False fusions deferred: True logging libraries: False",
                                            "problem: None", "threads: 1", "imported: True"], out.stdout


def test_forked_ranks_train_bitwise_like_fresh_interpreters(corpus, tmp_path):
    """TP=2 x DP=2 with a pre-emption-free run: same losses, step by step, exactly."""
    args = ["parallel.tp=2", "training.train_steps=4"]
    pretrain(4, *on_corpus(tmp_path / "fork", corpus), *args, fresh=True)  # the launcher's own template
    exec_env = dict(worker_env(), RECIPES_LOCAL_START="exec")
    out = subprocess.run([sys.executable, "-m", "recipes", "train", "--config", str(REPO / "configs/runs/tiny-cpu.yaml"),
                          "--local", "4", "--quiet", *on_corpus(tmp_path / "exec", corpus), *args],
                         cwd=REPO, env=exec_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    forked, fresh = losses(tmp_path / "fork"), losses(tmp_path / "exec")
    assert sorted(forked) == [1, 2, 3, 4]
    assert forked == fresh

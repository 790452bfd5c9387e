"""Bad recipes are refused before any worker process starts; a failure in a worker stops the whole job non-zero."""
from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from tests.support.runs import REPO, on_corpus, pretrain, pretrain_cmd, worker_env

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("overrides, expect", [
    (["parallel.tp=3"], "parallel.tp"),                            # 4 ranks cannot hold TP=3
    (["parallel.pp=2", "parallel.zero_stage=2"], "zero_stage"),    # DeepSpeed's pipeline engine refuses ZeRO-2/3
    (["training.global_batch=6", "parallel.tp=1"], "global_batch"),  # 6 samples over DP=4
    (["parallel.cp=4", "model.seq_length=36"], "parallel.cp"),     # 36 tokens are not 2 x 4 equal chunks
    (["training.precision=fp16", "training.loss_scale=0"], "fp16"),  # DeepSpeed has no fp16 on CPU
])
def test_invalid_recipe_refused_before_workers(overrides, expect, corpus, tmp_path):
    """The refusal happens in the launching process itself: it never starts a child (workers import torch for
    seconds, so polling every 20 ms cannot miss one)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(pretrain_cmd(4, *on_corpus(run_dir, corpus), *overrides), cwd=REPO, env=worker_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent, children = psutil.Process(proc.pid), set()
    while proc.poll() is None:
        try:
            children |= {c.pid for c in parent.children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    assert expect in stderr, stderr
    assert not children, f"worker processes were started: {children}"
    assert not run_dir.exists(), "a worker started (it created the run directory)"
    assert "layout:" not in stdout


def test_worker_exception_exits_nonzero(corpus, tmp_path):
    """Shards that exist but are not Megatron shards pass the launch checks (which look for the files, not into
    them) and fail inside the workers: the job stops, non-zero, naming the rank."""
    import json

    broken = tmp_path / "broken"
    broken.mkdir()
    manifest = json.loads(corpus.read_text())
    for entry in manifest["shards"]:
        for ext in (".bin", ".idx"):
            (broken / (entry["prefix"] + ext)).write_bytes(b"not a shard")
    (broken / "manifest.json").write_text(json.dumps(manifest))
    out = pretrain(2, *on_corpus(tmp_path / "run", broken / "manifest.json"), check=False, timeout=120)
    assert out.returncode != 0
    assert "exited with code" in out.stderr and "stopping the other ranks" in out.stderr, out.stderr[-2000:]

"""training.dist_timeout_minutes reaches every process group: the default group, megatron-core's TP/PP/DP/...
groups and DeepSpeed's pipeline, topology and tied-weight groups (torch's new_group defaults to 30 min on gloo and
10 min on NCCL whatever the default group was given)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support import rank_forks

pytestmark = pytest.mark.multiproc

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/runs/tiny-cpu.yaml")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_group_has_the_recipe_timeout(tmp_path):
    n, minutes = 4, 7
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), WORLD_SIZE=str(n),
               LOCAL_WORLD_SIZE=str(n), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    overrides = ["parallel.tp=2", "parallel.pp=2", f"training.dist_timeout_minutes={minutes}"]
    # each rank forked from the test process's pre-imported template (tests/support/rank_forks.py)
    procs = [subprocess.Popen([rank_forks.python(), str(REPO / "tests/training/group_timeout_worker.py"), str(tmp_path),
                               RECIPE, *overrides], cwd=REPO, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(n)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
    for r in range(n):
        groups = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert len(groups) >= 10, groups  # default + megatron-core's + DeepSpeed's, not just a few
        wrong = [g for g in groups if g["timeout_s"] != minutes * 60]
        assert not wrong, f"rank {r}: groups without training.dist_timeout_minutes={minutes}: {wrong}"

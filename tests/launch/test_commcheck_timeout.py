"""launch/commcheck.py waits no longer than the recipe's training.dist_timeout_minutes (torch's default is 30 min
on gloo), read back from the process group it made."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc

REPO = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _commcheck(tmp_path, *args) -> dict:
    out = tmp_path / "cc.json"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(REPO / "launch/commcheck.py"), "--max-bytes", "1024", "--iters", "1",
                           "--quiet", "--json", str(out), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_timeout_from_recipe(tmp_path):
    got = _commcheck(tmp_path, "--config", str(REPO / "configs/runs/tiny-cpu.yaml"), "training.dist_timeout_minutes=3")
    assert got["timeout_s"] == 180


def test_default_timeout_is_short(tmp_path):
    assert _commcheck(tmp_path)["timeout_s"] == 300

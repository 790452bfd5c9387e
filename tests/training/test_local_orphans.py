"""`recipes train --local`: SIGKILL of the launcher process leaves no worker training on as an orphan (the workers get
SIGTERM from the kernel when their parent dies, save and exit)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.runs import REPO, on_corpus, pretrain_cmd, worker_env

pytestmark = pytest.mark.multiproc


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_of_local_launcher_stops_workers(corpus, tmp_path):
    run_dir = tmp_path / "ckpt"
    proc = subprocess.Popen(pretrain_cmd(2, *on_corpus(run_dir, corpus), "training.train_steps=20000"), cwd=REPO,
                            env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run_dir / "run.lease").exists():  # rank 0 is up
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 40  # the run itself would go on for many minutes
    while any(_alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.5)
    left = [w for w in workers if _alive(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, "workers kept training after their launcher was killed"

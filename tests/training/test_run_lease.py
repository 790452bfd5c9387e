"""One run per checkpoint.dir: while a run trains, a second `recipes train --local` and a `launch/train.sh` on the same
checkpoint.dir are refused before they start anything (naming the run that holds it); the lease goes when the run
ends; a lease whose owner is dead (stale heartbeat, or its pid gone from this host) is taken over."""
from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from recipes.checkpoint import lease as run_lease
from tests.support.runs import REPO, RECIPE, on_corpus, pretrain, pretrain_cmd, worker_env

pytestmark = pytest.mark.multiproc


def test_second_run_refused_while_first_trains(corpus, tmp_path):
    run_dir = tmp_path / "ckpt"
    first = subprocess.Popen(pretrain_cmd(2, *on_corpus(run_dir, corpus), "training.train_steps=400"), cwd=REPO,
                             env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lease_file = run_dir / run_lease.LEASE
        deadline = time.time() + 120
        while not lease_file.exists():
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.2)
        holder = json.loads(lease_file.read_text())["run_id"]

        second = pretrain(2, *on_corpus(run_dir, corpus), check=False, timeout=60)
        assert second.returncode == 2, second.stderr[-2000:]
        assert holder in second.stderr and "run.lease" in second.stderr and "layout:" not in second.stdout

        logs = tmp_path / "logs"
        launched = subprocess.run(["bash", str(REPO / "launch/train.sh"), RECIPE, "--backend", "local", "--num-gpus",
                                   "2", "--log-dir", str(logs), "--", f"data.manifests=[{corpus}]",
                                   f"checkpoint.dir={run_dir}"], cwd=REPO, env=worker_env(), capture_output=True,
                                  text=True, timeout=60)
        assert launched.returncode == 5 and holder in launched.stderr, launched.stderr[-2000:]
        assert not list(logs.glob("*.log"))  # no node was started
        assert first.poll() is None, "the first run must still be training (make it longer if this fails)"
    finally:
        first.terminate()  # pre-emption path: saves, releases the lease, exits 0
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-3000:]
    assert not lease_file.exists()


def test_dead_owner_is_taken_over(tmp_path):
    stale = {"run_id": "old", "host": "elsewhere", "pid": 1, "heartbeat": time.time() - run_lease.STALE_S - 1}
    (tmp_path / run_lease.LEASE).write_text(json.dumps(stale))
    assert run_lease.holder_problem(tmp_path, "new") is None
    fresh_elsewhere = dict(stale, heartbeat=time.time())
    (tmp_path / run_lease.LEASE).write_text(json.dumps(fresh_elsewhere))
    assert "run old (host elsewhere" in run_lease.holder_problem(tmp_path, "new")
    dead_here = dict(fresh_elsewhere, host=socket.gethostname(), pid=2 ** 22 + 7)  # no such process
    (tmp_path / run_lease.LEASE).write_text(json.dumps(dead_here))
    lease = run_lease.Lease(tmp_path, "new").acquire()
    assert json.loads((tmp_path / run_lease.LEASE).read_text())["run_id"] == "new"
    lease.release()
    assert not (tmp_path / run_lease.LEASE).exists()

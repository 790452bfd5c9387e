"""Unattended runs through launch/train.sh with real processes: a killed rank under --max-restarts resumes from the
newest complete checkpoint with the uninterrupted run's losses; a hung rank has its stack dumped and the job
restarts; restarts run out with the reason; a stop is never restarted; a host that failed twice makes way for a
spare (loopback sshd "nodes"). Faults come from RECIPES_TEST_FAULT (recipes/train/faults.py), read at rank start."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.launch import REPO, TOY, TOY_ENTRY, free_port, launch_env, run_launch, run_pids
from tests.support.runs import losses, pretrain

REAL_RECIPE = REPO / "configs" / "runs" / "tiny-cpu.yaml"
FAST_BACKOFF = "supervision.restart_backoff_seconds=0.5"
# The ranks import this tree (the venv's editable install may point at another checkout).
TREE_ENV = {"PYTHONPATH": str(REPO)}


def restarts(logs: Path) -> list[dict]:
    f = logs / "restarts.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def toy_launch(tmp_path, *args, fault="", overrides=(), env_extra=None, timeout=180):
    """The toy data-parallel program on 2 local ranks under train.sh; returns (process result, log dir, TOY_OUT)."""
    logs, out = tmp_path / "logs", tmp_path / "losses.json"
    env = launch_env(TOY_OUT=out, RECIPES_TEST_FAULT=fault, **TREE_ENV, **(env_extra or {}))
    r = run_launch("train.sh", TOY, "--backend", "local", "--num-gpus", 2, "--entry", TOY_ENTRY,
                   "--env", "TOY_OUT,RECIPES_TEST_FAULT,PYTHONPATH", "--master-port", free_port(), "--log-dir", logs,
                   "--quiet", *args, "--", FAST_BACKOFF, *overrides, env=env, timeout=timeout)
    return r, logs, out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tests.support.corpus import write_corpus

    return write_corpus(tmp_path_factory.mktemp("corpus"), max_bytes=200_000)


def real_launch(run_dir: Path, corpus, *args, fault=""):
    """`recipes train` (tiny recipe, 2 ranks: DP=2 with ZeRO-1) through train.sh, a checkpoint every 2 steps."""
    r = run_launch("train.sh", REAL_RECIPE, "--backend", "local", "--num-gpus", 2, "--master-port", free_port(),
                   "--log-dir", run_dir / "launch", "--env", "RECIPES_TEST_FAULT,PYTHONPATH", "--quiet", *args, "--",
                   f"data.manifests=[{corpus}]", f"checkpoint.dir={run_dir}", "checkpoint.save_interval=2",
                   "training.train_steps=6", "training.log_interval=1", FAST_BACKOFF,
                   env=launch_env(RECIPES_TEST_FAULT=fault, **TREE_ENV), timeout=400)
    assert r.returncode == 0, r.stderr[-5000:]
    return r


@pytest.mark.multiproc
@pytest.mark.timeout(900)
def test_killed_rank_is_restarted_and_resumes_bit_exactly(corpus, tmp_path):
    ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "restarted"
    # the reference: the same recipe on 2 local ranks, uninterrupted
    pretrain(2, f"data.manifests=[{corpus}]", f"checkpoint.dir={ref_dir}", "checkpoint.save_interval=2",
             "training.train_steps=6", "training.log_interval=1", config=str(REAL_RECIPE))
    t0 = time.time()
    r = real_launch(run_dir, corpus, "--max-restarts", 2, fault="kill rank=1 step=5 attempt=1")
    elapsed = time.time() - t0
    ref, got = losses(ref_dir), losses(run_dir)
    assert sorted(got) == list(range(1, 7))
    assert [got[s] for s in range(1, 7)] == [ref[s] for s in range(1, 7)]  # bitwise: the resume is exact
    (rec,) = restarts(run_dir / "launch")
    assert rec["restart"] == 1 and rec["attempt"] == 2 and rec["exit_code"] == 137
    assert rec["rank"] == 1 and rec["host"] == "localhost"
    # Killed before step 5: the newest complete checkpoint is step 4's, or step 2's while step 4's async save was
    # still being written (complete.json only once every rank's files are durable).
    assert rec["resumed_from_step"] in (2, 4)
    # last_step: the heartbeats' highest step (a new step is written at once): rank 1 died before training step 5
    assert rec["last_step"] == 4 and rec["steps_lost"] == 4 - rec["resumed_from_step"]
    assert "restart 1 of 2" in r.stderr and "restarting run" in r.stderr, r.stderr
    assert f"from step {rec['resumed_from_step']}" in r.stderr, r.stderr
    assert "finished: all 2 ranks exited 0 (after 1 restart(s))" in r.stderr
    # The attempts' logs are kept apart: the kill is in attempt-1/, the finished attempt at the top.
    assert "exit=137" in (run_dir / "launch" / "attempt-1" / "localhost.log").read_text()
    assert "LAUNCH-FAIL" not in (run_dir / "launch" / "localhost.log").read_text()
    # Straggler report: per-rank compute-time percentiles in the metrics (the slow rank named: test_stragglers.py).
    rec6 = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()][-1]
    assert 0 < rec6["compute_time_p50_s"] <= rec6["compute_time_p90_s"] <= rec6["compute_time_max_s"]
    print(f"\nkill at step 5 -> finished in {elapsed:.1f} s (with restart); record {rec}")


@pytest.mark.multiproc
def test_hung_rank_has_its_stack_dumped_and_the_job_restarts(tmp_path, local_reference_2):
    r, logs, out = toy_launch(tmp_path, "--max-restarts", 1, fault="hang rank=1 step=3 attempt=1",
                              overrides=("supervision.hang_timeout_seconds=8",), env_extra={"TOY_STEP_SLEEP": "0.2"})
    assert r.returncode == 0, r.stderr[-4000:]
    assert "HANG: no rank advanced for 8 s" in r.stderr, r.stderr
    assert "behind: rank 1 on host localhost (step 2, phase data)" in r.stderr, r.stderr
    stacks = logs / "attempt-1" / "stacks"
    hung, waiting = (stacks / "rank-1.txt").read_text(), (stacks / "rank-0.txt").read_text()
    assert "_hang_forever" in hung and "maybe_fire" in hung, hung  # faulthandler: where the rank is stuck
    assert "_hang_forever" not in waiting and "all_reduce" in waiting, waiting  # its peer waits in the collective
    (rec,) = restarts(logs)
    assert rec["why"].startswith("hang") and rec["rank"] == 1 and rec["last_step"] == 2
    assert json.loads(out.read_text())["losses"] == pytest.approx(local_reference_2, rel=1e-6)  # it finished
    assert "step 3 loss" in (logs / "localhost.log").read_text()  # the toy trains 4 steps


@pytest.fixture(scope="module")
def local_reference_2(tmp_path_factory):
    """The toy's losses without faults, 2 ranks, no restart."""
    r, _, out = toy_launch(tmp_path_factory.mktemp("ref2"))
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())["losses"]


@pytest.mark.multiproc
def test_restarts_run_out_with_the_reason(tmp_path):
    r, logs, out = toy_launch(tmp_path, "--max-restarts", 1, fault="kill rank=0 step=2")  # every attempt
    assert r.returncode == 1
    assert "FAILED: no restarts left: 1 of 1 used" in r.stderr and "last failure: exit code 137" in r.stderr, r.stderr
    assert [x["restart"] for x in restarts(logs)] == [1]
    assert (logs / "attempt-1" / "localhost.log").exists() and (logs / "localhost.log").exists()
    assert not out.exists()


@pytest.mark.multiproc
def test_a_requested_stop_is_not_restarted(tmp_path):
    run_id = f"stop-norestart-{os.getpid()}"
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        ["bash", str(REPO / "launch" / "train.sh"), str(TOY), "--backend", "local", "--num-gpus", "2", "--entry",
         TOY_ENTRY, "--env", "TOY_STEP_SLEEP,PYTHONPATH", "--run-id", run_id, "--master-port", str(free_port()),
         "--log-dir", str(logs), "--quiet", "--max-restarts", "3", "--", "training.train_steps=500", FAST_BACKOFF],
        cwd=REPO, env=launch_env(TOY_STEP_SLEEP="0.2", **TREE_ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.time() + 90
    while "step 2 loss" not in ((logs / "localhost.log").read_text() if (logs / "localhost.log").exists() else ""):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.3)
    s = subprocess.run(["bash", str(REPO / "launch" / "stop.sh"), str(logs)], cwd=REPO, capture_output=True,
                       text=True, env=launch_env(), timeout=60)
    assert s.returncode == 0, s.stderr
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"STOPPED: run {run_id} was stopped on request" in err, err
    assert "restart 1" not in err and restarts(logs) == [] and not (logs / "attempt-2").exists()
    assert run_pids(run_id) == []


@pytest.mark.ssh
@pytest.mark.timeout(400)
def test_spare_replaces_a_host_that_failed_twice(tmp_path, local_reference):
    from tests.support.loopback_ssh import loopback_sshd, unavailable

    why = unavailable()
    if why:
        pytest.fail(f"no loopback sshd: {why}")
    with loopback_sshd(str(tmp_path / "sshd"), {"node1": "127.0.0.1", "node2": "127.0.0.2",
                                                "node3": "127.0.0.3"}) as config:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("node1 slots=2\nnode2 slots=2\nnode3 slots=2  # the spare\n")
        logs, out = tmp_path / "logs", tmp_path / "losses.json"
        env = launch_env(LAUNCH_SSH_CONFIG=config, TOY_OUT=out, RECIPES_TEST_FAULT="kill rank=2 step=2 host=node2",
                         **TREE_ENV)
        r = run_launch("train.sh", TOY, "--hostfile", hostfile, "--backend", "torchrun-ssh", "--spares", 1,
                       "--max-restarts", 3, "--entry", TOY_ENTRY, "--env", "TOY_OUT,RECIPES_TEST_FAULT,PYTHONPATH",
                       "--master-port", free_port(), "--log-dir", logs, "--quiet", "--", FAST_BACKOFF, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "spares: node3" in r.stderr
    assert "host node2 failed twice: replaced by spare node3 (slots=2); the world stays 4 ranks" in r.stderr, r.stderr
    recs = restarts(logs)
    assert [(x["host"], x["replaced"]) for x in recs] == [("node2", None), ("node2", "node2>node3")]
    assert recs[-1]["hosts"] == "node1 node3"
    assert (logs / "hosts").read_text().split() == ["node1", "node3"]
    # The same world and layout: ranks 2-3 now on node3, and the losses of the 1-process reference.
    assert "[node3 rank 2] step 3 loss" in (logs / "node3.log").read_text()
    assert json.loads(out.read_text())["losses"] == pytest.approx(local_reference, rel=1e-5)

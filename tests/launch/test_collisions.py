"""Runs that share nodes do not hurt each other, and a launcher's death leaves nothing behind (real sshd on
loopback, 2 nodes x 2 ranks): SIGKILL and, separately, SIGHUP of the launcher mid-run -> no process of the run after
the stop grace + 30 s; two concurrent runs with default ports both finish; Ctrl-C of one DeepSpeed run leaves a
second DeepSpeed run on the same nodes alive."""
import os
import signal
import subprocess
import time

import pytest

from tests.support.launch import REPO, TOY, TOY_ENTRY, free_port, launch_env, run_launch, run_pids

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(240)]
GRACE = 5  # launch_env's LAUNCH_STOP_GRACE


def _start(ssh_cluster, logs, backend, run_id, steps=500, port=None, **popen):
    config, hostfile = ssh_cluster
    args = ["bash", str(REPO / "launch" / "train.sh"), str(TOY), "--hostfile", str(hostfile), "--backend", backend,
            "--entry", TOY_ENTRY, "--env", "TOY_STEP_SLEEP", "--run-id", run_id, "--log-dir", str(logs), "--quiet",
            *(["--master-port", str(port)] if port else []), "--", f"training.train_steps={steps}"]
    return subprocess.Popen(args, cwd=REPO, env=launch_env(LAUNCH_SSH_CONFIG=config, TOY_STEP_SLEEP="0.3"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _wait_step1(proc, logs):
    deadline = time.time() + 120
    while time.time() < deadline:
        if all((logs / f"node{n}.log").exists() and "step 1 loss" in (logs / f"node{n}.log").read_text()
               for n in (1, 2)):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.3)
    proc.kill()
    pytest.fail(f"the run never reached step 1: {proc.communicate()}")


def _gone_within(run_id, seconds) -> list[int]:
    deadline = time.time() + seconds
    while run_pids(run_id) and time.time() < deadline:
        time.sleep(0.5)
    return run_pids(run_id)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_launcher_death_leaves_no_rank(ssh_cluster, tmp_path, sig):
    run_id = f"death-{sig.name}-{os.getpid()}"
    proc = _start(ssh_cluster, tmp_path / "logs", "torchrun-ssh", run_id)
    try:
        _wait_step1(proc, tmp_path / "logs")
        assert len(run_pids(run_id)) >= 4
        os.kill(proc.pid, sig)  # the launcher only, as the OOM killer or a closed terminal would
        left = _gone_within(run_id, GRACE + 30)
        assert not left, f"processes of run {run_id} still alive after {GRACE + 30} s: {left}"
    finally:
        for p in run_pids(run_id):
            os.kill(p, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def test_two_runs_with_default_ports_both_finish(ssh_cluster, tmp_path):
    runs = [(_start(ssh_cluster, tmp_path / f"logs{i}", "torchrun-ssh", f"pair{i}-{os.getpid()}", steps=12),
             tmp_path / f"logs{i}") for i in (1, 2)]
    for proc, logs in runs:
        out, err = proc.communicate(timeout=200)
        assert proc.returncode == 0, err[-3000:]
    ports = {(logs / "plan.txt").read_text().split("master=")[1].split()[0] for _, logs in runs}
    assert len(ports) == 2, ports  # different rendezvous ports, none given


def test_ctrl_c_of_one_deepspeed_run_spares_another(ssh_cluster, tmp_path):
    other_id, mine_id = f"other-{os.getpid()}", f"mine-{os.getpid()}"
    # explicit ports: this test is about DeepSpeed's pkill, not about port collisions
    other = _start(ssh_cluster, tmp_path / "other", "deepspeed", other_id, port=free_port())
    mine = _start(ssh_cluster, tmp_path / "mine", "deepspeed", mine_id, port=free_port(), start_new_session=True)
    try:
        _wait_step1(other, tmp_path / "other")
        _wait_step1(mine, tmp_path / "mine")
        os.killpg(mine.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the launcher's whole process group
        mine.communicate(timeout=GRACE + 60)
        assert not _gone_within(mine_id, GRACE + 30)
        time.sleep(3)
        assert other.poll() is None, other.communicate()
        assert len(run_pids(other_id)) >= 4, "the other run lost ranks"
    finally:
        run_launch("stop.sh", tmp_path / "other", env=launch_env(LAUNCH_SSH_CONFIG=ssh_cluster[0]))
        for p in run_pids(other_id) + run_pids(mine_id):
            os.kill(p, signal.SIGKILL)
        for p in (other, mine):
            p.kill()
            p.communicate()

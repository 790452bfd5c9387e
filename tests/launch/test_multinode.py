"""End to end through a real sshd on loopback: 2 nodes x 2 ranks (gloo) with each back end that runs here, losses
equal to a local 4-rank run (real training with `recipes train` through the DeepSpeed runner over pdsh; the small
data-parallel toy through torchrun over ssh, against the same toy in one process); one rank killed -> everything stops; preflight; the communication
check; stop.sh."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launch import failures
from tests.support.launch import REPO, TOY, TOY_ENTRY, free_port, launch_env, run_launch, run_pids
from tests.support.runs import losses, on_corpus, pretrain

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(200)]


def cluster_env(ssh_cluster, **extra):
    config, _ = ssh_cluster
    return launch_env(LAUNCH_SSH_CONFIG=config, **extra)


REAL_RECIPE = REPO / "configs" / "runs" / "tiny-cpu.yaml"


def real_training(tmp_path, corpus, *args, env):
    """`recipes train` on the tiny recipe, TP=2 inside a node x DP=2 across nodes; returns step -> loss."""
    ckpt = tmp_path / "ckpt"
    r = run_launch("train.sh", REAL_RECIPE, *args, "--master-port", free_port(), "--log-dir", tmp_path / "logs",
                   "--quiet", "--", f"data.manifests=[{corpus}]", f"checkpoint.dir={ckpt}", "parallel.tp=2",
                   "training.train_steps=4", env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    records = [json.loads(l) for l in (ckpt / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {rec["step"]: rec["loss"] for rec in records if "loss" in rec}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tests.support.corpus import write_corpus  # the training tests' real-text shards (megatron-core writer)

    return write_corpus(tmp_path_factory.mktemp("corpus"), max_bytes=200_000)


@pytest.mark.timeout(600)
def test_real_training_two_nodes_deepspeed_matches_local(ssh_cluster, corpus, tmp_path):
    _, hostfile = ssh_cluster
    # the reference: the same 4 ranks on this machine (`recipes train --local 4`)
    pretrain(4, *on_corpus(tmp_path / "local", corpus), "parallel.tp=2", "training.train_steps=4")
    local = losses(tmp_path / "local")
    multi = real_training(tmp_path / "multi", corpus, "--hostfile", hostfile, "--backend", "deepspeed",
                          env=cluster_env(ssh_cluster))
    assert sorted(local) == [1, 2, 3, 4]
    assert multi == pytest.approx(local, rel=1e-5, abs=0)
    assert local[4] < local[1]  # it trains
    n1, n2 = (tmp_path / "multi" / "logs" / "node1.log").read_text(), (tmp_path / "multi" / "logs" / "node2.log").read_text()
    # Only rank 0 speaks (progress, its checkpoint log line: after the bar's carriage returns, on a line the launcher
    # prefixed); every line is in its own host's log.
    raw = (tmp_path / "multi" / "logs" / "node1.log").read_bytes().decode()  # read_text would turn the bar's \r into \n
    assert any(line.startswith("[node1 rank 0] ") and "checkpoint: saved" in line for line in raw.split("\n")), n1
    assert "[node2 rank" not in n1 and "[node1 rank" not in n2


@pytest.mark.parametrize("backend", ["torchrun-ssh"])
def test_two_nodes_match_local_run(ssh_cluster, local_reference, tmp_path, backend):
    _, hostfile = ssh_cluster
    out = tmp_path / "losses.json"
    logs = tmp_path / "logs"
    r = run_launch("train.sh", TOY, "--hostfile", hostfile, "--backend", backend, "--entry", TOY_ENTRY,
                   "--env", "TOY_OUT", "--master-port", free_port(), "--log-dir", logs, "--quiet",
                   env=cluster_env(ssh_cluster, TOY_OUT=out))
    assert r.returncode == 0, r.stderr + r.stdout
    data = json.loads(out.read_text())  # written by rank 0 on node1: TOY_OUT reached it only through --env
    assert data["world_size"] == 4
    assert data["losses"] == pytest.approx(local_reference, rel=1e-5, abs=0)
    # Per-node logs with rank prefixes: node1 holds ranks 0-1, node2 ranks 2-3.
    n1, n2 = (logs / "node1.log").read_text(), (logs / "node2.log").read_text()
    for rank in (0, 1):
        assert f"[node1 rank {rank}] step 3 loss" in n1 and f"[node1 rank {rank}]" not in n2
    for rank in (2, 3):
        assert f"[node2 rank {rank}] step 3 loss" in n2 and f"[node2 rank {rank}]" not in n1


def _rank_pid(run_id: str, rank: int) -> int | None:
    """The training process (not the launcher's wrapper) of one rank of a run."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"LAUNCH_RUN_ID={run_id}".encode() in env and f"RANK={rank}".encode() in env \
                and cmd[0].endswith(b"python") and any(c.endswith(b"toy_train.py") for c in cmd):
            return int(p.name)
    return None


def _start_long_run(ssh_cluster, tmp_path, backend, run_id, env=None, env_names=(), overrides=()):
    _, hostfile = ssh_cluster
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        ["bash", str(REPO / "launch" / "train.sh"), str(TOY), "--hostfile", str(hostfile), "--backend", backend,
         "--entry", TOY_ENTRY, "--env", "TOY_STEP_SLEEP", *(a for n in env_names for a in ("--env", n)),
         "--run-id", run_id, "--master-port", str(free_port()),
         "--log-dir", str(logs), "--quiet", "--", "training.train_steps=500", *overrides],
        cwd=REPO, env=env or cluster_env(ssh_cluster, TOY_STEP_SLEEP="0.3"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        if "step 1 loss" in (logs / "node2.log").read_text() if (logs / "node2.log").exists() else False:
            return proc, logs
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.3)
    proc.kill()
    pytest.fail(f"the run never reached step 1: {proc.communicate()}")


@pytest.mark.parametrize("backend", ["torchrun-ssh", "deepspeed"])
def test_killed_rank_stops_every_node(ssh_cluster, tmp_path, backend):
    run_id = f"killtest-{backend}-{os.getpid()}"
    proc, logs = _start_long_run(ssh_cluster, tmp_path, backend, run_id)
    victim = _rank_pid(run_id, 2)  # rank 2 = the first rank on node2
    assert victim, "rank 2's training process not found"
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)  # a hang detector: the run would otherwise train 500 steps (150 s)
    assert proc.returncode != 0
    assert "FAILED: rank 2 on host node2 exited with code 137 (killed by signal 9) first" in err, err
    assert run_pids(run_id) == []  # nothing of the run is left on any node
    records = failures.ExitWatch(logs / "attempt-1" / "exits").poll()
    died = next(r for r in records if r.rank == 2)
    assert (died.exit_code, died.stopped) == (137, False) and all(r.at >= died.at for r in records), records
    assert "step 499" not in (logs / "node1.log").read_text()


def test_stop_script_stops_a_running_job(ssh_cluster, tmp_path):
    run_id = f"stoptest-{os.getpid()}"
    proc, logs = _start_long_run(ssh_cluster, tmp_path, "torchrun-ssh", run_id)
    # the run dir remembers the hosts; ssh takes the caller's own options (never a config file from the run dir)
    r = subprocess.run(["bash", str(REPO / "launch" / "stop.sh"), str(logs)], cwd=REPO, capture_output=True,
                       text=True, env=cluster_env(ssh_cluster), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "stopped run " + run_id in r.stdout
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert f"STOPPED: run {run_id} was stopped on request" in err, err
    assert run_pids(run_id) == []


def test_stop_waits_for_the_preemption_save_the_recipe_allows(ssh_cluster, tmp_path):
    """checkpoint.stop_grace_seconds=600 and a save that takes 14 s (TOY_SAVE_SECONDS, the toy's stand-in for a slow
    file system): stop.sh waits for it instead of SIGKILLing after the old fixed 10 s (the new checkpoint is complete,
    every rank recorded a clean exit after the stop's SIGTERM: none was killed), and returns once the ranks are gone,
    not after the grace (its 90 s time-out is far below the 600 s grace). (Under torchrun, the agent itself gives its
    workers 30 s after a SIGTERM: keep saves below that there.)"""
    run_id = f"gracetest-{os.getpid()}"
    ckpt = tmp_path / "toyckpt"
    env = cluster_env(ssh_cluster, TOY_STEP_SLEEP="0.3", TOY_CKPT=str(ckpt), TOY_SAVE_SECONDS="14",
                      PYTHONPATH=str(REPO))  # the ranks validate the override with this tree's schema
    env.pop("LAUNCH_STOP_GRACE")  # the recipe decides
    proc, logs = _start_long_run(ssh_cluster, tmp_path, "torchrun-ssh", run_id, env=env,
                                 env_names=("TOY_CKPT", "TOY_SAVE_SECONDS", "PYTHONPATH"),
                                 overrides=("checkpoint.stop_grace_seconds=600",))
    assert (logs / "stop_grace").read_text().strip() == "600"
    stop_env = cluster_env(ssh_cluster)
    stop_env.pop("LAUNCH_STOP_GRACE")
    r = subprocess.run(["bash", str(REPO / "launch" / "stop.sh"), str(logs)], cwd=REPO, capture_output=True,
                       text=True, env=stop_env, timeout=90)
    assert r.returncode == 0, r.stderr
    _, err = proc.communicate(timeout=90)
    assert f"STOPPED: run {run_id} was stopped on request" in err, err
    saved = sorted(ckpt.glob("step_*"))
    assert len(saved) == 1 and (saved[0] / "complete.json").exists(), saved
    records = failures.ExitWatch(logs / "attempt-1" / "exits").poll()
    assert sorted((r.rank, r.exit_code, r.stopped) for r in records) == [(k, 0, True) for k in range(4)], records
    assert run_pids(run_id) == []


def test_preflight_over_ssh(ssh_cluster, tmp_path):
    config, hostfile = ssh_cluster
    ckpt = tmp_path / "ckpt"
    r = run_launch("preflight.sh", TOY, "--hostfile", hostfile, "--backend", "torchrun-ssh", "--",
                   f"checkpoint.dir={ckpt}", env=cluster_env(ssh_cluster))
    assert r.returncode == 0, r.stderr
    assert "node node1: ok (slots=2" in r.stderr and "node node2: ok (slots=2" in r.stderr
    assert list(ckpt.iterdir()) == []  # its probe files are cleaned up

    bad = tmp_path / "hostfile"
    bad.write_text(hostfile.read_text() + "node3 slots=2\n")  # no such host
    # (an entry other than `recipes train`: the launcher leaves its data to it, so the nodes are asked about the path;
    # for `recipes train` a missing manifest is refused before any node is: test_launch_refusals.py)
    r = run_launch("preflight.sh", TOY, "--hostfile", bad, "--backend", "torchrun-ssh", "--entry", TOY_ENTRY, "--",
                   "training.global_batch=6", f"data.manifests=[{tmp_path / 'missing' / 'manifest.json'}]",
                   "cluster.device=cuda", env=cluster_env(ssh_cluster))
    assert r.returncode == 4
    assert "node node3: unreachable over ssh" in r.stderr
    assert "node node1: data path" in r.stderr and "is not visible" in r.stderr
    assert "node node2: no nvidia-smi but the recipe runs on cuda" in r.stderr
    # train.sh refuses the same unreachable node before starting anything
    logs = tmp_path / "logs"
    r = run_launch("train.sh", TOY, "--hostfile", bad, "--backend", "torchrun-ssh", "--log-dir", logs,
                   "--", "training.global_batch=6", env=cluster_env(ssh_cluster))
    assert r.returncode == 4 and "node3: NOT ready" in r.stderr
    assert not list(logs.glob("*.log"))


def test_comm_check_reports_bus_bandwidth(ssh_cluster, tmp_path):
    _, hostfile = ssh_cluster
    out = tmp_path / "comm.json"
    r = run_launch("preflight.sh", TOY, "--hostfile", hostfile, "--backend", "torchrun-ssh", "--comm-check",
                   "--env", "COMMCHECK_JSON,COMMCHECK_MAX_BYTES", "--master-port", free_port(),
                   "--log-dir", tmp_path / "logs", env=cluster_env(ssh_cluster, COMMCHECK_JSON=out,
                                                                  COMMCHECK_MAX_BYTES=1 << 18))
    assert r.returncode == 0, r.stderr + r.stdout
    data = json.loads(out.read_text())
    assert data["world_size"] == 4 and data["hosts"] == ["node1", "node1", "node2", "node2"]
    assert [row["bytes"] for row in data["rows"]] == [1024, 4096, 16384, 65536, 262144]
    for row in data["rows"]:
        assert row["ok"] and row["time_us"] > 0
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9, rel=1e-9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 3 / 4, rel=1e-9)
    assert "busbw(GB/s)" in r.stdout and "results correct" in r.stdout

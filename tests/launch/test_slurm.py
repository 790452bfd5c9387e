"""`launch/train.sh --backend slurm` against a real Slurm (munged + slurmctld + slurmd on this machine, one node named
after `hostname` with 2 ranks): a job runs to completion with the losses of a one-process run, from a hostfile and
without one (`--nodes 1`: Slurm picks the node); a rank SIGKILLed inside the job ends it non-zero with the rank
named; a requeued training job (`scontrol requeue`, then the USR1 warning before the time limit) resumes from its
newest complete checkpoint and continues bit for bit; on a two-node Slurm a requeued job whose node was drained lands
on the other node (no node list pins it); a container is refused with the reason where srun has no pyxis; the job
script asks for no GPUs on a CPU recipe."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.launch import REPO, TOY, TOY_DATA, TOY_ENTRY, launch_env
from tests.support.runs import pretrain

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(300)]

REAL_RECIPE = REPO / "configs" / "runs" / "tiny-cpu.yaml"


def submit(slurm, tmp_path, recipe, *args, env=None, hostfile=True, **extra_env):
    """train.sh --backend slurm on a hostfile of the cluster's one node (or, hostfile=False, with the nodes in ARGS:
    --nodes N --gpus-per-node G); returns (job id, log dir)."""
    where = []
    if hostfile:
        (tmp_path / "hostfile").write_text(f"{slurm.node} slots=2\n")
        where = ["--hostfile", str(tmp_path / "hostfile")]
    logs = tmp_path / "logs"
    env = dict(launch_env(**extra_env), SLURM_CONF=slurm.env["SLURM_CONF"])
    env.pop("LAUNCH_HOSTFILE", None)
    r = subprocess.run(["bash", str(REPO / "launch" / "train.sh"), str(recipe), *where, "--backend", "slurm",
                        "--log-dir", str(logs), *map(str, args)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job_id = (logs / "slurm_job_id").read_text().strip()
    assert f"submitted Slurm job {job_id}" in r.stderr
    return job_id, logs


def job_output(logs: Path, job_id: str) -> str:
    return (logs / f"slurm-{job_id}.out").read_text()


def wait_for(pred, timeout, what, detail=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.3)
    pytest.fail(f"timed out ({timeout} s) waiting for {what}" + (f"\n{detail()}" if detail else ""))


def _tails(logs: Path, slurm) -> str:
    """The run's logs and the cluster's, for a failure message."""
    out = [f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:] for p in sorted(logs.glob("*.log"))
           + sorted(logs.glob("slurm-*.out"))]
    return "\n".join(out) + "\n" + slurm.logs_tail(8)


def _run_pids(run_id: str, rank: int | None = None) -> list[int]:
    """Processes of a run (every one carries LAUNCH_RUN_ID); with ``rank``, only that rank's training process."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit():
                continue
            env = (p / "environ").read_bytes().split(b"\0")
            if f"LAUNCH_RUN_ID={run_id}".encode() not in env:
                continue
            if rank is not None:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
                if f"RANK={rank}".encode() not in env or not cmd[0].endswith(b"python") or \
                        not any(c.endswith(b"toy_train.py") for c in cmd):
                    continue
            pids.append(int(p.name))
        except OSError:
            pass
    return pids


def test_toy_job_completes_with_the_losses_of_a_local_run(slurm, local_reference, tmp_path):
    out = tmp_path / "losses.json"
    job_id, logs = submit(slurm, tmp_path, TOY, "--entry", TOY_ENTRY, "--env", "TOY_OUT", TOY_OUT=out)
    script = (logs / "job.sbatch").read_text()
    assert "--gpus-per-node" not in script  # a CPU recipe; this cluster has no GPUs (sbatch would refuse the job)
    job = slurm.wait_job(job_id, timeout=120)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), job_output(logs, job_id)
    data = json.loads(out.read_text())  # TOY_OUT reached rank 0 only through the 0600 env file
    assert data["world_size"] == 2
    assert data["losses"] == pytest.approx(local_reference, rel=1e-5, abs=0)
    node_log = (logs / f"{slurm.node}.log").read_text()
    for rank in (0, 1):
        assert f"[{slurm.node} rank {rank}] step 3 loss" in node_log
    assert "finished: all 2 ranks exited 0" in job_output(logs, job_id)
    assert not (logs / "secret.env").exists()  # the job removed it when it ended


def test_killed_rank_fails_the_job_naming_the_rank(slurm, tmp_path):
    run_id = f"slurmkill-{os.getpid()}"
    job_id, logs = submit(slurm, tmp_path, TOY, "--entry", TOY_ENTRY, "--env", "TOY_STEP_SLEEP", "--run-id", run_id,
                          "--", "training.train_steps=500", TOY_STEP_SLEEP="0.3")
    node_log = logs / f"{slurm.node}.log"
    wait_for(lambda: node_log.exists() and f"[{slurm.node} rank 1] step 1 loss" in node_log.read_text(), 90,
             f"rank 1 of job {job_id} to reach step 1")
    victim = _run_pids(run_id, rank=1)
    assert len(victim) == 1, victim
    os.kill(victim[0], signal.SIGKILL)
    job = slurm.wait_job(job_id, timeout=60)
    out = job_output(logs, job_id)
    assert job["JobState"] == "FAILED" and job["ExitCode"] != "0:0", (job, out)
    assert f"FAILED: rank 1 on host {slurm.node} exited with code 137 (killed by signal 9) first; the job ends" in out
    assert "step 499" not in node_log.read_text()
    wait_for(lambda: not _run_pids(run_id), 10, "every process of the job to be gone")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tests.support.corpus import write_corpus

    return write_corpus(tmp_path_factory.mktemp("corpus"), max_bytes=200_000)


def _losses(ckpt: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (ckpt / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def _complete_steps(ckpt: Path) -> list[int]:
    return sorted(int(p.parent.name.removeprefix("global_step")) for p in ckpt.glob("global_step*/complete.json"))


def _release(slurm, job_id: str, restarts: int) -> None:
    """Once the job is pending after its requeue, let it start now: Slurm holds a requeued job back (its BeginTime
    lies ~2 minutes ahead) so that a failing job does not spin; an administrator does the same with this command."""
    wait_for(lambda: slurm.job(job_id)["Restarts"] == str(restarts) and slurm.job(job_id)["JobState"] == "PENDING",
             60, f"job {job_id} to be pending after requeue {restarts}")
    # ...and the node done with the previous attempt: started on a node still cleaning it up, slurmd refuses the job
    # ("Killing non-startable batch job: Job credential revoked", seen once) and it ends FAILED.
    wait_for(slurm.node_idle, 60, f"node {slurm.node} to be idle after requeue {restarts}",
             lambda: f"node: {slurm.run('scontrol', '-o', 'show', 'node', check=False).stdout}\nqueue: "
                     f"{slurm.run('squeue', '-a', check=False).stdout}\njob {slurm.job(job_id)}\n{slurm.logs_tail(8)}")
    idle_seen = time.time()
    # slurmd revoked the job's credential when it ended the previous attempt, and refuses a credential of the same job
    # id created in that second or before (`cred->ctime <= j->revoked`, whole seconds): revoked before the node went
    # idle, so one made in a later second than the idle node was seen is the new attempt's own.
    wait_for(lambda: int(time.time()) > int(idle_seen), 5, "the clock to pass the second the node went idle")
    slurm.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")


@pytest.mark.timeout(420)
def test_requeued_training_job_resumes_from_its_newest_checkpoint(slurm, corpus, tmp_path):
    """Real `recipes train` (tiny model, 2 ranks): requeued twice while running, first with `scontrol requeue` (Slurm
    stops every process: the ranks save on SIGTERM), then with the USR1 that `--signal=B:USR1@grace` sends before the
    time limit (the job script stops the ranks and requeues itself). Each attempt resumes from the newest complete
    checkpoint; the losses equal those of one uninterrupted local run, bit for bit."""
    steps = 60  # the first two attempts stop after ~10 and ~20 steps; the third trains to the end
    common = [f"data.manifests=[{corpus}]", f"training.train_steps={steps}", "checkpoint.save_interval=50"]
    ckpt = tmp_path / "ckpt"
    job_id, logs = submit(slurm, tmp_path, REAL_RECIPE, "--", *common, f"checkpoint.dir={ckpt}")

    def trained_past(step):
        return lambda: (ckpt / "logs" / "metrics.jsonl").exists() and any(s > step for s, _ in _losses(ckpt))

    wait_for(trained_past(6), 150, "the first attempt to train past step 6")
    slurm.run("scontrol", "requeue", job_id)
    _release(slurm, job_id, 1)
    wait_for(lambda: f"job {job_id} (restart 1)" in job_output(logs, job_id), 60, "the requeued job to start")
    done_before = max(s for s, _ in _losses(ckpt))
    wait_for(trained_past(done_before + 3), 150, "the second attempt to train on")
    slurm.run("scancel", "--batch", "--signal=USR1", job_id)  # what Slurm sends LAUNCH_SLURM_GRACE s before the limit
    _release(slurm, job_id, 2)
    job = slurm.wait_job(job_id, timeout=240)
    out = job_output(logs, job_id)
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "2"), (job, out[-3000:])
    assert "USR1: time limit near" in out and "requeueing job" in out
    for restart in (0, 1, 2):
        assert f"job {job_id} (restart {restart})" in out
    log = (logs / f"{slurm.node}.log").read_text()
    stopped = re.findall(r"stopped by signal after step (\d+)", log)
    resumed = re.findall(r"resumed from \S+/global_step(\d+) at step (\d+)", log)
    assert len(stopped) == 2 and resumed == [(s, s) for s in stopped], log[-3000:]  # from the checkpoint just saved

    # the same training, uninterrupted, on 2 local ranks
    ref = tmp_path / "ref"
    pretrain(2, *common, f"checkpoint.dir={ref / 'ckpt'}", config=str(REAL_RECIPE), timeout=300)
    want = dict(_losses(ref / "ckpt"))
    assert sorted(want) == list(range(1, steps + 1))
    for s, loss in _losses(ckpt):  # a step trained again after a resume must repeat its loss exactly
        assert loss == want[s], f"step {s}: {loss} after requeue, {want[s]} uninterrupted"
    assert sorted(dict(_losses(ckpt))) == list(range(1, steps + 1))  # no step lost


def test_without_a_hostfile_slurm_picks_the_node(slurm, local_reference, tmp_path):
    """`--nodes 1 --gpus-per-node 2`, no hostfile: the script names no node; the job learns its node from
    SLURM_JOB_NODELIST (the master, the host names in the logs) and completes with the losses of a local run.
    sbatch's own options reach the job as Slurm reads them (scontrol's fields)."""
    out = tmp_path / "losses.json"
    job_id, logs = submit(slurm, tmp_path, TOY, "--nodes", 1, "--gpus-per-node", 2, "--partition", "debug",
                          "--account", "proj-1", "--qos", "normal", "--time", "30", "--exclusive", "--entry",
                          TOY_ENTRY, "--env", "TOY_OUT", hostfile=False, TOY_OUT=out)
    script = (logs / "job.sbatch").read_text()
    assert "#SBATCH --nodes=1\n" in script and "--nodelist" not in script
    assert (logs / "hosts").read_text() == ""  # nothing known at submission
    job = slurm.wait_job(job_id, timeout=120)
    assert (job["JobState"], job["ExitCode"], job["NodeList"]) == ("COMPLETED", "0:0", slurm.node), \
        job_output(logs, job_id)
    assert job["ReqNodeList"] == "(null)"  # Slurm was free to choose
    assert (job["Partition"], job["Account"], job["TimeLimit"], job["OverSubscribe"]) == \
        ("debug", "proj-1", "00:30:00", "NO")  # (this cluster keeps no accounting: its QOS reads "(null)")
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and data["losses"] == pytest.approx(local_reference, rel=1e-5, abs=0)
    assert f"job {job_id} (restart 0) on {slurm.node} " in job_output(logs, job_id)
    node_log = (logs / f"{slurm.node}.log").read_text()
    for rank in (0, 1):  # rank_exec.sh named the host from the job's node list
        assert f"[{slurm.node} rank {rank}] step 3 loss" in node_log


def test_container_refused_where_srun_has_no_pyxis(slurm, tmp_path):
    """The test cluster loads no SPANK plugin (an empty plugstack.conf): `srun --help` lists no --container-image,
    so a container launch is refused with that reason, exit 2, and nothing is submitted."""
    help_text = slurm.run("srun", "--help").stdout
    assert "--kill-on-bad-exit" in help_text and "--container-image" not in help_text
    env = dict(launch_env(), SLURM_CONF=slurm.env["SLURM_CONF"])
    logs = tmp_path / "logs"
    r = subprocess.run(["bash", str(REPO / "launch" / "train.sh"), str(TOY), "--backend", "slurm", "--nodes", "1",
                        "--gpus-per-node", "2", "--container-image", "nvcr.io#nvidia/pytorch:25.01-py3",
                        "--container-mounts", f"{REPO}:{REPO},{tmp_path}:{tmp_path}", "--log-dir", str(logs),
                        "--run-id", f"nopyxis-{os.getpid()}", "--", f"data.manifests=[{TOY_DATA}]"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert ("--container-image needs pyxis and enroot on the cluster: `srun --help` lists no --container-image: the "
            "pyxis SPANK plugin is not installed (or not in plugstack.conf) here.") in r.stderr
    assert "nothing was submitted" in r.stderr and not (logs / "slurm_job_id").exists()
    assert f"nopyxis-{os.getpid()}" not in slurm.run("squeue", "-h", "-o", "%j").stdout


@pytest.fixture(scope="module")
def two_nodes(slurm, tmp_path_factory):
    """A second Slurm: two nodes (nodea, nodeb: two slurmd on this machine) and a pyxis stand-in SPANK plugin
    (tests/support/spank_container_standin.c: srun lists --container-image; a task given one fails to start). Next to
    the session's one-node cluster (its own ports, config and processes), whose fixture decides whether Slurm can run
    here."""
    from tests.support.slurm import build_spank_plugin, slurm_cluster

    root = tmp_path_factory.mktemp("slurm2")
    try:
        plugin = build_spank_plugin(REPO / "tests" / "support" / "spank_container_standin.c", root)
    except RuntimeError as e:
        pytest.fail(str(e))
    with slurm_cluster(str(root / "cluster"), ["nodea", "nodeb"], [str(plugin)]) as cluster:
        yield cluster


@pytest.mark.timeout(400)
def test_a_requeued_job_lands_where_slurm_puts_it(two_nodes, tmp_path):
    """The job runs on one node; that node is drained (as an administrator or Slurm's health check would after a
    fault) and the job requeued: it starts again on the other node, because the script pins none. (With the old
    `#SBATCH --nodelist=<every node>` it would wait for the drained node: ReqNodeNotAvail.)"""
    slurm = two_nodes
    job_id, logs = submit(slurm, tmp_path, TOY, "--nodes", 1, "--gpus-per-node", 2, "--entry", TOY_ENTRY, "--env",
                          "TOY_STEP_SLEEP", "--", "training.train_steps=16", hostfile=False, TOY_STEP_SLEEP="0.5")
    wait_for(lambda: slurm.job(job_id)["JobState"] == "RUNNING", 90, f"job {job_id} to run")
    first = slurm.job(job_id)["NodeList"]
    assert first in ("nodea", "nodeb")
    other = ({"nodea", "nodeb"} - {first}).pop()
    node_log = logs / f"{slurm.host}.log"  # srun's %N is the host name: both nodes run on this machine
    wait_for(lambda: node_log.exists() and f"[{first} rank 1] step 1 loss" in node_log.read_text(), 240,
             f"job {job_id} to train on {first}", lambda: _tails(logs, slurm))
    slurm.run("scontrol", "update", f"NodeName={first}", "State=DRAIN", "Reason=launcher-test")
    slurm.run("scontrol", "requeue", job_id)
    wait_for(lambda: slurm.job(job_id)["Restarts"] == "1" and slurm.job(job_id)["JobState"] == "PENDING", 60,
             f"job {job_id} to be pending after the requeue")
    wait_for(lambda: slurm.node_idle(other), 60, f"node {other} to be idle")
    slurm.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")  # skip Slurm's requeue hold-back
    job = slurm.wait_job(job_id, timeout=240)
    out = job_output(logs, job_id)
    assert (job["JobState"], job["ExitCode"], job["Restarts"], job["NodeList"]) == ("COMPLETED", "0:0", "1", other), \
        (job, out[-3000:])
    assert f"job {job_id} (restart 0) on {first} " in out and f"job {job_id} (restart 1) on {other} " in out
    assert "DRAIN" in slurm.node_state(first).split("+")
    assert f"[{other} rank 0] step 15 loss" in node_log.read_text()  # rank_exec.sh named it from the job's nodes


def test_container_job_whose_tasks_never_start_is_a_failure(two_nodes, tmp_path):
    """With a plugin that gives srun --container-image (here the pyxis stand-in), the launch is submitted; the
    rendered srun line is accepted by srun. On the node the plugin fails the task, and srun still exits 0 (as it does
    with pyxis 0.24 on a node without enroot, seen here): the job must not report success. It ends FAILED, saying that
    no rank left an exit record."""
    slurm = two_nodes
    assert "--container-image" in slurm.run("srun", "--help").stdout
    mounts = f"{REPO}:{REPO},{tmp_path}:{tmp_path}"
    job_id, logs = submit(slurm, tmp_path, TOY, "--nodes", 1, "--gpus-per-node", 2, "--container-image",
                          "nvcr.io#nvidia/pytorch:25.01-py3", "--container-mounts", mounts, "--",
                          f"data.manifests=[{TOY_DATA}]", hostfile=False)
    job = slurm.wait_job(job_id, timeout=120)
    out = job_output(logs, job_id)
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "1:0"), (job, out)
    assert "task 0 launch failed: Plugin initialization failed" in out
    assert ("[launch] FAILED: srun exited 0 but only 0 of 2 ranks left an exit record: a node's task did not "
            "start") in out
    assert "finished: all 2 ranks exited 0" not in out

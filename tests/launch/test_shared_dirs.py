"""Nothing spoofable in shared directories (issue 25, the launcher's findings), each proved the way an attacker with
write access to a shared log dir, or a run's own output, would try it:
- a 0666 `secret.env.tmp` planted in the log dir does not make the env file readable; a log dir others can write to
  is refused;
- stop.sh never takes an ssh config from the run folder (a ProxyCommand there never runs) and never guesses the run;
- heartbeat, stack-dump and hang-verdict files are never written through a planted link;
- a heartbeat's host is checked (a host like `-oProxyCommand=...` never reaches ssh);
- a rank printing a `LAUNCH-FAIL rank=` line keeps training, and the run finishes 0;
- `kill -9` of prep.sh leaves no slice running on any node;
- a Slurm stop waits the recipe's grace for the ranks' save (not Slurm's KillWait)."""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from launch import watchdog
from recipes.train.heartbeat import Heartbeat, install_stack_dump
from tests.support.launch import REPO, TOY, TOY_ENTRY, big_prep_corpus, free_port, launch_env, run_launch, run_pids
from tests.support.launch import tokenize_pids as _tokenize_pids


def _slice_pids(out: Path) -> list[int]:
    def is_slice(pid: int) -> bool:
        try:
            return b"--slice" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            return False
    return [p for p in _tokenize_pids(out) if is_slice(p)]


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.write_text("precious\n")
    return v


# --- unit: refusals and exclusive creation ---------------------------------------------------------------------

@pytest.mark.unit
def test_a_log_dir_others_can_write_is_refused(tmp_path):
    logs = tmp_path / "shared"
    logs.mkdir()
    logs.chmod(0o777)
    r = run_launch("train.sh", TOY, "--num-gpus", 2, "--dry-run", "--log-dir", logs)
    assert r.returncode == 2 and f"the log dir {logs} is writable by other users (mode 0777)" in r.stderr, r.stderr
    assert list(logs.iterdir()) == []  # nothing written into it


@pytest.mark.unit
def test_group_writable_or_foreign_log_dirs_and_parents_are_refused(tmp_path):
    """Round 4: a dir made under umask 002 (group-writable), a parent others can write without the sticky bit, and a
    parent owned by another user are refused; what the launcher makes itself under umask 002 is accepted (the check
    in process; the launcher's own refusal and umask below)."""
    from launch.common import LaunchError
    from launch.run_files import make_private_dir

    def refusal(path) -> str:
        with pytest.raises(LaunchError) as e:
            make_private_dir(path)  # as the launcher makes its log dir: created if missing, then checked upwards
        return str(e.value)

    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    assert f"the log dir {group} is writable by its group (mode 0775)" in refusal(group)
    assert f"`chmod go-w {group}`" in refusal(group)
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)  # no sticky bit: others could rename our run dir away and put theirs there
    assert f"{tmp_path / 'open'} is writable by other users (mode 0777)" in refusal(tmp_path / "open" / "run")
    (tmp_path / "sticky").mkdir()
    (tmp_path / "sticky").chmod(0o1777)  # /tmp's case: others cannot touch what is ours
    make_private_dir(tmp_path / "sticky" / "run")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)  # nobody's (the tests run as root)
    assert f"{theirs} belongs to another user (uid 65534)" in refusal(theirs / "run")
    old = os.umask(0o002)
    try:
        made = make_private_dir(tmp_path / "made" / "here")
    finally:
        os.umask(old)
    assert all(stat.S_IMODE(d.stat().st_mode) & 0o022 == 0 for d in (made, made.parent))


@pytest.mark.multiproc
def test_the_launcher_refuses_a_shared_log_dir_and_makes_its_own_private_under_umask_002(tmp_path):
    """The same rules through launch/train.sh: exit 2 with the fix and nothing written; under umask 002 the dirs it
    makes are not group-writable."""
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    r = run_launch("train.sh", TOY, "--num-gpus", 2, "--dry-run", "--log-dir", group)
    assert r.returncode == 2 and f"the log dir {group} is writable by its group (mode 0775)" in r.stderr
    assert f"`chmod go-w {group}`" in r.stderr and list(group.iterdir()) == []
    r = subprocess.run(["bash", "-c", f'umask 002 && exec bash {REPO / "launch" / "train.sh"} {TOY} --num-gpus 2 '
                        f'--dry-run --log-dir {tmp_path / "made" / "here"}'], capture_output=True, text=True,
                       cwd=REPO, env=dict(os.environ), timeout=120)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "made").stat().st_mode) & 0o022 == 0


@pytest.mark.unit
def test_run_files_are_written_past_planted_links_and_read_without_blocking(tmp_path):
    """A link planted where the launcher writes a run file is replaced, not written through; a FIFO or a link to
    /dev/zero where it reads an exit record or a heartbeat is skipped at once (the supervisor never hangs on it)."""
    from launch import failures, run_files

    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "launch.env").symlink_to(victim)
    run_files.write(run / "launch.env", "A=1\n")
    assert victim.read_text() == "precious\n" and not (run / "launch.env").is_symlink()
    assert stat.S_IMODE((run / "launch.env").stat().st_mode) == 0o600
    exits = tmp_path / "exits"
    exits.mkdir()
    os.mkfifo(exits / "rank-0.exit")
    (exits / "rank-1.exit").symlink_to("/dev/zero")
    (exits / "rank-2.exit").write_text("rank=2 exit=1 stopped=0 at=5.0 host=node1\n")
    beats = tmp_path / "beats"
    beats.mkdir()
    os.mkfifo(beats / "rank-0.json")
    (beats / "rank-1.json").symlink_to("/dev/zero")
    read = []
    reader = threading.Thread(target=lambda: read.append((failures.ExitWatch(exits).poll(),
                                                           watchdog.read_heartbeats(beats))), daemon=True)
    reader.start()
    reader.join(timeout=120)  # a hang detector, not a speed bound: only a blocking open or an endless read stays
    hung = reader.is_alive()
    for _ in range(100 if hung else 0):  # let a reader blocked in open() go, FIFO after FIFO
        for fifo in (exits / "rank-0.exit", beats / "rank-0.json"):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # nobody waits on this one (yet)
                pass
        reader.join(0.1)
    assert not hung, "reading a planted FIFO or a link to /dev/zero never returned: the supervisor would hang on it"
    records, heartbeats = read[0]
    assert [r.rank for r in records] == [2]
    assert heartbeats == {}


@pytest.mark.unit
def test_stop_needs_the_run_named(tmp_path):
    r = run_launch("stop.sh")
    assert r.returncode == 2 and "give the run to stop" in r.stderr and "never guesses" in r.stderr, r.stderr


@pytest.mark.unit
def test_stop_never_takes_an_ssh_config_from_the_run_folder(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil_config"
    evil.write_text(f"Host *\n  ProxyCommand touch {marker}\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "hosts").write_text("127.0.0.1\n")
    (run / "backend").write_text("torchrun-ssh\n")
    (run / "launch.env").write_text("LAUNCH_RUN_ID=planted-run\n")
    (run / "ssh_config").write_text(f"{evil}\n")  # what train.sh used to record, and stop.sh used to trust
    r = run_launch("stop.sh", run, env=launch_env(LAUNCH_SSH_TIMEOUT="3"), timeout=60)
    assert not marker.exists(), "the run folder's ssh config ran a command"
    assert r.returncode != 0  # no sshd on 127.0.0.1:22 with the caller's options: a failed stop, said so


@pytest.mark.unit
def test_heartbeat_and_stack_files_never_follow_a_planted_link(tmp_path, monkeypatch):
    victim = _victim(tmp_path)
    hb = tmp_path / "hb"
    hb.mkdir()
    for name in (".rank-3.json.tmp", "rank-3.json"):  # the old fixed temporary name, and the final one
        (hb / name).symlink_to(victim)
    monkeypatch.setenv("RANK", "3")
    Heartbeat(hb)
    assert victim.read_text() == "precious\n"
    assert json.loads((hb / "rank-3.json").read_text())["rank"] == 3 and not (hb / "rank-3.json").is_symlink()
    assert stat.S_IMODE((hb / "rank-3.json").stat().st_mode) == 0o600

    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "rank-3.txt").symlink_to(victim)
    monkeypatch.setenv("LAUNCH_STACKS_DIR", str(stacks))
    try:
        path = install_stack_dump()
    finally:
        faulthandler.unregister(signal.SIGUSR2)
    assert victim.read_text() == "precious\n" and not path.is_symlink() and path.read_text().startswith("# rank 3")


@pytest.mark.unit
def test_the_hang_verdict_never_follows_a_planted_link(tmp_path):
    victim = _victim(tmp_path)
    for name in ("hang.json.tmp", "hang.json"):
        (tmp_path / name).symlink_to(victim)
    beats = {0: {"rank": 0, "host": "n1", "pid": 5, "step": 1, "phase": "data"}}
    watchdog.write_verdict(tmp_path / "hang.json", watchdog.verdict(beats, 2, 5))
    assert victim.read_text() == "precious\n"
    assert json.loads((tmp_path / "hang.json").read_text())["behind"] == [1]


# --- real runs ---------------------------------------------------------------------------------------------------

@pytest.mark.multiproc
def test_planted_secret_tmp_file_does_not_make_the_env_file_readable(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    planted = logs / "secret.env.tmp"
    planted.write_text("")
    planted.chmod(0o666)  # another user's file, readable and writable by all
    probe = tmp_path / "probe.py"  # the rank: report the env file's mode and whether the secret arrived
    probe.write_text("import os, stat\nm = stat.S_IMODE(os.stat(os.environ['LAUNCH_ENV_FILE']).st_mode)\n"
                     "print(f'MODE {m:o} TOKEN {os.environ.get(\"HF_TOKEN\") == \"hf_SENTINEL\"}')\n")
    r = run_launch("train.sh", TOY, "--num-gpus", 1, "--entry", f"python {probe}", "--master-port", free_port(),
                   "--log-dir", logs, env=launch_env(HF_TOKEN="hf_SENTINEL"), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MODE 600 TOKEN True" in r.stdout, r.stdout[-2000:]
    assert "hf_SENTINEL" not in planted.read_text()


@pytest.mark.multiproc
def test_a_rank_printing_a_spoofed_failure_line_keeps_running(tmp_path):
    out = tmp_path / "losses.json"
    spoof = "LAUNCH-FAIL rank=0 host=localhost exit=1 at=1.0 cmd=x"
    r = run_launch("train.sh", TOY, "--backend", "local", "--num-gpus", 2, "--entry", TOY_ENTRY, "--env", "TOY_OUT",
                   "--master-port", free_port(), "--log-dir", tmp_path / "logs", "--quiet", "--", f"name={spoof}",
                   env=launch_env(TOY_OUT=out), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"[localhost rank 0] {spoof}: " in (tmp_path / "logs" / "localhost.log").read_text()  # it was printed
    assert len(json.loads(out.read_text())["losses"]) == 4  # and every step trained


@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_a_planted_heartbeat_host_never_reaches_ssh(ssh_cluster, tmp_path):
    """A hang on two loopback nodes: the launcher dumps every rank's stack over ssh. A heartbeat planted in the shared
    dir names the host `-oProxyCommand=<script>`: it must never reach ssh (an OpenSSH that does not check host names,
    before 9.x, would run the script; this one refuses the next argument as a host name, so every argument ssh got is
    recorded by a wrapper first on PATH)."""
    config, hostfile = ssh_cluster
    marker, evil = tmp_path / "pwned", tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\n")
    evil.chmod(0o755)
    wrappers, ssh_args = tmp_path / "bin", tmp_path / "ssh_args"
    wrappers.mkdir()
    (wrappers / "ssh").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" >>{ssh_args}\nexec /usr/bin/ssh \"$@\"\n")
    (wrappers / "ssh").chmod(0o755)
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        ["bash", str(REPO / "launch" / "train.sh"), str(TOY), "--hostfile", str(hostfile), "--backend",
         "torchrun-ssh", "--num-gpus", "1", "--entry", TOY_ENTRY, "--env", "RECIPES_TEST_FAULT,PYTHONPATH",
         "--master-port", str(free_port()), "--log-dir", str(logs), "--quiet", "--",
         "supervision.hang_timeout_seconds=8", "training.global_batch=2"], cwd=REPO,
        env=launch_env(LAUNCH_SSH_CONFIG=config, RECIPES_TEST_FAULT="hang rank=1 step=2", PYTHONPATH=str(REPO),
                       PATH=f"{wrappers}:{os.environ['PATH']}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hb = logs / "attempt-1" / "heartbeat"
    deadline = time.time() + 120
    while not ((hb / "rank-0.json").exists() and (hb / "rank-1.json").exists()):  # both ranks in the loop
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    (hb / "rank-9.json").write_text(json.dumps({"rank": 9, "host": f"-oProxyCommand={evil}", "pid": 1, "step": 9,
                                                "phase": "data"}))
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-3000:]
    assert "HANG: no rank advanced for 8 s" in err, err[-3000:]
    assert not marker.exists(), "a heartbeat's host reached ssh as an option"
    assert not [a for a in ssh_args.read_text().splitlines() if "ProxyCommand" in a], "the planted host reached ssh"
    assert "_hang_forever" in (logs / "attempt-1" / "stacks" / "rank-1.txt").read_text()  # the real dumps happened


@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_kill_9_of_prep_leaves_no_slice_running(ssh_cluster, tmp_path):
    """prep.sh SIGKILLed once node1's slice runs, while the ssh client of the other node's slice is still connecting
    (its first connection waits CONNECT_DELAY s in a ProxyCommand; the guard's stop connects at once): node1's slice
    is stopped by the guard, and the other slice never starts (its client died with the launcher; left alive, it
    started the slice after the guard had found nothing there, and that slice ran on, orphaned)."""
    config, hostfile = ssh_cluster
    delay = 10
    slow_config, slow_hostfile = tmp_path / "ssh_config", tmp_path / "hostfile"
    node2 = config.read_text().split("Host node2\n")[1].split("Host ")[0]
    once = tmp_path / "connected_once"
    slow_config.write_text(config.read_text() + "Host slownode\n" + node2 + f"  ProxyCommand sh -c '[ -e {once} ] || "
                           f"{{ touch {once}; sleep {delay}; }}; exec ssh -F {config} -W %h:%p node1'\n")
    slow_hostfile.write_text("node1 slots=2\nslownode slots=2\n")
    corpus, model = big_prep_corpus(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(REPO / "launch" / "prep.sh"), "--hostfile", str(slow_hostfile), "--log-dir",
                             str(tmp_path / "logs"), "--", str(corpus), "-o", str(out), "-t", model, "--no-fast-path",
                             "--shard-size", "16M"], cwd=tmp_path,  # ssh's banner timeout past the delay
                            env=launch_env(LAUNCH_SSH_CONFIG=slow_config, LAUNCH_SSH_TIMEOUT="30"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while not _slice_pids(out):  # node1's (not the launcher's probe of the inputs, also `data_prep tokenize`)
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        assert once.exists() and time.time() < once.stat().st_mtime + delay, "slownode's slice was not connecting"
        os.kill(proc.pid, signal.SIGKILL)  # the launcher only, as the OOM killer would
        proc.communicate(timeout=30)
        deadline = time.time() + 5 + 30  # stop grace + 30 s
        while _tokenize_pids(out) and time.time() < deadline:
            time.sleep(0.5)
        assert not _tokenize_pids(out), "tokenize still running on a node after kill -9 of prep.sh"
        time.sleep(max(0.0, once.stat().st_mtime + delay + 8 - time.time()))  # past when slownode's would start
        assert not _tokenize_pids(out), "a slice started after kill -9 of prep.sh"
    finally:
        for p in _tokenize_pids(out):
            os.kill(p, signal.SIGKILL)


@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_slurm_stop_waits_the_recipes_grace_not_killwait(slurm, tmp_path):
    """The test cluster's KillWait is 10 s; the toy's save takes 16 s and the recipe allows 60: the stop signals the
    job's steps itself and the checkpoint is complete."""
    from tests.launch.test_slurm import _run_pids, submit, wait_for

    run_id, ckpt = f"slurmgrace-{os.getpid()}", tmp_path / "toyckpt"
    job_id, logs = submit(slurm, tmp_path, TOY, "--entry", TOY_ENTRY, "--env", "TOY_STEP_SLEEP,TOY_CKPT,"
                          "TOY_SAVE_SECONDS,PYTHONPATH", "--run-id", run_id, "--", "training.train_steps=500",
                          "checkpoint.stop_grace_seconds=60", TOY_STEP_SLEEP="0.3", TOY_CKPT=str(ckpt),
                          TOY_SAVE_SECONDS="16", PYTHONPATH=str(REPO), LAUNCH_STOP_GRACE="")  # the recipe's
    assert (logs / "stop_grace").read_text().strip() == "60"
    node_log = logs / f"{slurm.node}.log"
    wait_for(lambda: node_log.exists() and "step 1 loss" in node_log.read_text(), 120, "the job to reach step 1")
    env = dict(launch_env(), SLURM_CONF=slurm.env["SLURM_CONF"])
    env.pop("LAUNCH_STOP_GRACE")  # the recipe decides
    t0 = time.time()
    r = subprocess.run(["bash", str(REPO / "launch" / "stop.sh"), str(logs)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    waited = time.time() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    saved = sorted(ckpt.glob("step_*"))
    assert len(saved) == 1 and (saved[0] / "complete.json").exists(), (saved, waited, r.stdout, r.stderr)
    job = slurm.wait_job(job_id, timeout=60)
    assert job["JobState"] == "COMPLETED", job
    assert "stopped on request" in (logs / f"slurm-{job_id}.out").read_text()
    wait_for(lambda: not _run_pids(run_id), 30, "every process of the job to be gone")
    assert run_pids(run_id) == []

"""Stop a run on all of its nodes: SIGTERM to every process that carries the run's LAUNCH_RUN_ID (the ranks save a
checkpoint and exit), SIGKILL to what is left after the grace. A Slurm run: SIGTERM to the job's steps, the same
grace, then SIGKILL (not Slurm's KillWait).

    launch/stop.sh RUN_DIR | RUN_ID          a run started by launch/train.sh (the run id is required)
    launch/stop.sh --local RUN_ID [--grace S]          on a node: this node's processes of the run
    launch/stop.sh --signal-local SIG RUN_ID PID...    on a node: signal those processes of the run (stack dumps)
Grace: LAUNCH_STOP_GRACE if set, else the recipe's checkpoint.stop_grace_seconds (train.sh keeps it in
RUN_DIR/stop_grace), else 10 s. ssh uses the caller's own options (LAUNCH_SSH_CONFIG), never a file from the run
directory; the hosts come from RUN_DIR/hosts and must keep the hostfile's host rule."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from launch import run_files
from launch.common import REPO_DIR, RUN_ID_RE, LaunchError, remote_launch
from launch.hostfile import valid_host
from launch.ssh import Ssh

DEFAULT_GRACE = 10
_SLURM_ACTIVE = {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING"}


def _carries(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False


def run_pids(run_id: str) -> list[int]:
    """Every process on this node started for the run, except this one."""
    mark = f"LAUNCH_RUN_ID={run_id}".encode()
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me and _carries(int(p), mark)]


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_local(run_id: str, grace: float) -> str:
    pids = run_pids(run_id)
    if not pids:
        return f"{socket.gethostname()}: no processes of run {run_id}"
    _signal(pids, signal.SIGTERM)
    end = time.monotonic() + grace
    while run_pids(run_id) and time.monotonic() < end:
        time.sleep(0.2)
    _signal(run_pids(run_id), signal.SIGKILL)
    return f"{socket.gethostname()}: stopped run {run_id}"


def signal_local(sig: str, run_id: str, pids: list[str]) -> list[str]:
    """Only processes of this run: a pid from a heartbeat file may have been reused since."""
    number = getattr(signal, f"SIG{sig}", None)
    if not re.fullmatch(r"[A-Z0-9]+", sig) or number is None:
        raise LaunchError(f"unknown signal '{sig}'", 2)
    mark, done = f"LAUNCH_RUN_ID={run_id}".encode(), []
    for pid in pids:
        if pid.isdigit() and _carries(int(pid), mark):
            _signal([int(pid)], number)
            done.append(f"{socket.gethostname()}: SIG{sig} to pid {pid} of run {run_id}")
    return done


def stop_hosts(ssh: Ssh, hosts: list[str], run_id: str, grace: float) -> tuple[int, str]:
    """`stop --local` on every host at once: (1 if a host failed else 0, what they said)."""
    cmd = remote_launch("stop", "--local", run_id, "--grace", f"{grace:g}")
    rc, text = 0, ""
    for host, r in ssh.run_all(hosts, lambda h: cmd).items():
        text += r.stdout + r.stderr
        rc |= r.returncode != 0
    return rc, text


def grace_of(run_dir: Path | None, environ=os.environ) -> float:
    text = environ.get("LAUNCH_STOP_GRACE", "")
    if not text and run_dir is not None:
        try:
            text = run_files.read(run_dir / "stop_grace", 64).strip()
        except (OSError, ValueError):
            text = ""
    return float(text) if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) else DEFAULT_GRACE


def run_dir_of(target: str) -> Path:
    """The run directory: a path, or a run id under runs/launch/."""
    p = Path(target)
    if not p.is_dir() and RUN_ID_RE.match(target):
        p = REPO_DIR / "runs" / "launch" / target
    if not (p / "hosts").is_file():
        raise LaunchError(f"{target} is not a run directory (no hosts file); pass the --log-dir of the run or its "
                          "run id", 2)
    return p.resolve()


def _run_facts(run_dir: Path) -> tuple[str, list[str], str]:
    """run id, hosts and back end recorded by train.sh; each checked (the directory holds text, not commands)."""
    env = _read(run_dir / "launch.env").splitlines()
    run_id = next((line.split("=", 1)[1] for line in env if line.startswith("LAUNCH_RUN_ID=")), "")
    if not RUN_ID_RE.match(run_id):
        raise LaunchError(f"{run_dir}/launch.env names no valid LAUNCH_RUN_ID; is this a run directory?", 2)
    hosts = _read(run_dir / "hosts").split()
    bad = [h for h in hosts if not valid_host(h)]
    if bad:
        raise LaunchError(f"{run_dir}/hosts: '{bad[0]}' is not a host name; not stopping through it", 2)
    backend = _read(run_dir / "backend").strip()
    return run_id, hosts, backend


def _read(path: Path) -> str:
    """A run file as text ("" if missing), read as launch.run_files reads them: never through a link or a FIFO."""
    try:
        return run_files.read(path)
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as e:
        raise LaunchError(f"{path}: not a file of this run ({e}); not stopping through it", 2) from None


def stop_run(target: str, by_launcher: bool = False, environ=os.environ) -> int:
    run_dir = run_dir_of(target)
    run_id, hosts, backend = _run_facts(run_dir)
    grace = grace_of(run_dir, environ)
    if by_launcher:  # the launcher is gone or ending: its env file goes too
        (run_dir / "secret.env").unlink(missing_ok=True)
    else:  # so that the launcher reports a requested stop, not a failure
        run_files.write(run_dir / "stop_requested", f"{time.time():.0f}\n", private=False)
    job = run_dir / "slurm_job_id"
    if job.is_file():
        rc = stop_slurm(_read(job).strip(), grace)
        (run_dir / "secret.env").unlink(missing_ok=True)  # the job removes it only when it ends by itself
        return rc
    if backend == "local":
        print(stop_local(run_id, grace), flush=True)
        return 0
    rc, text = stop_hosts(Ssh(environ), hosts, run_id, grace)
    print(text, end="", flush=True)
    return rc


def _slurm_state(job_id: str) -> str | None:
    """The job's state; "" when it is no longer queued; None when squeue did not answer (a busy controller)."""
    r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    if r.returncode == 0:
        return r.stdout.strip().split("\n")[0]
    return "" if "Invalid job id" in r.stderr else None


def _running(job_id: str) -> bool:
    state = _slurm_state(job_id)
    return state is None or state in _SLURM_ACTIVE


def stop_slurm(job_id: str, grace: float) -> int:
    """SIGTERM to the job's steps (not the batch script: it sees RUN_DIR/stop_requested and ends the job itself), up
    to `grace` seconds for the ranks' pre-emption save, then SIGKILL to whatever is left, then the job is cancelled.
    (A plain scancel would give the ranks only Slurm's KillWait.)"""
    if not job_id.isdigit():
        raise LaunchError(f"slurm_job_id '{job_id}' is not a job id", 2)
    if _slurm_state(job_id) != "PENDING" and _running(job_id):
        subprocess.run(["scancel", "--signal=TERM", job_id])
        end = time.monotonic() + grace
        while _running(job_id) and time.monotonic() < end:
            time.sleep(1)
        if _running(job_id):
            subprocess.run(["scancel", "--signal=KILL", "--full", job_id])
    rc = subprocess.run(["scancel", job_id]).returncode if _slurm_state(job_id) != "" else 0  # pending, or still there
    print(f"stopped Slurm job {job_id}", flush=True)
    return rc

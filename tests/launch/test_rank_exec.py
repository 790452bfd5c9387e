"""launch/rank_exec.sh, the wrapper around every rank, run for real: its exit record says how the rank ended and
whether a stop ended it, also when the stop reaches the wrapper just after the rank died on its own (the case torchrun
makes when it stops a node's group after one rank was killed: before, recorded as a stop, and the peer's exit 1 was
named the failure)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from launch import failures
from tests.support.launch import REPO

pytestmark = pytest.mark.unit

WRAPPER = str(REPO / "launch" / "rank_exec.sh")


def _start(tmp_path, code: str) -> subprocess.Popen:
    env = dict(os.environ, LAUNCH_EXIT_DIR=str(tmp_path), RANK="1", LAUNCH_HOST="node1")
    return subprocess.Popen(["bash", WRAPPER, sys.executable, "-c", f"import os, signal, sys, time\n{code}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _record(tmp_path, proc) -> tuple[failures.ExitRecord, str]:
    out, _ = proc.communicate(timeout=30)
    rec = failures.parse_record((tmp_path / "rank-1.exit").read_text())
    assert rec is not None and rec.rank == 1 and rec.host == "node1", out
    assert proc.returncode == rec.exit_code, out
    return rec, out


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_rank_that_fails_on_its_own_is_recorded_with_its_code_and_output(tmp_path):
    rec, out = _record(tmp_path, _start(tmp_path, "print('bad shard', flush=True); sys.exit(3)"))
    assert (rec.exit_code, rec.stopped, rec.failed_on_its_own) == (3, False, True)
    assert sorted(out.splitlines()) == ["[node1 rank 1] bad shard", "[node1 rank 1] exited on its own: exit=3"], out


def test_a_stop_while_the_rank_runs_reaches_it_and_is_recorded_as_a_stop(tmp_path):
    proc = _start(tmp_path, "print('up', flush=True); time.sleep(30)")
    assert proc.stdout.readline().strip() == "[node1 rank 1] up"
    proc.send_signal(signal.SIGTERM)  # the wrapper alone: it passes the stop on
    rec, _ = _record(tmp_path, proc)
    assert (rec.exit_code, rec.stopped, rec.failed_on_its_own) == (143, True, False)


def test_a_stop_arriving_just_after_the_rank_was_killed_leaves_it_the_failure(tmp_path):
    """The wrapper is held (SIGSTOP) while its rank SIGKILLs itself, then gets the stop and resumes: the rank's death
    and the stop are pending at once, as on a loaded node. The record must say exit 137, not stopped."""
    proc = _start(tmp_path, "print(os.getpid(), flush=True); time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)")
    rank = int(proc.stdout.readline().split()[-1])
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 20
        while _running(rank) and time.monotonic() < deadline:  # dead (a zombie at most); its wrapper has not run
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    rec, _ = _record(tmp_path, proc)
    assert (rec.exit_code, rec.stopped, rec.failed_on_its_own) == (137, False, True)


def test_only_the_names_the_launcher_wrote_are_exported_from_the_env_file(tmp_path):
    """Round 4: a line planted in the env file (LD_PRELOAD, PYTHONPATH) never reaches the rank; the names the
    launcher listed in LAUNCH_ENV_NAMES do. A link or a FIFO in the env file's place stops the rank before it runs."""
    env_file = tmp_path / "secret.env"
    env_file.write_text("HF_TOKEN=abc\nLD_PRELOAD=/tmp/evil.so\nPYTHONPATH=/tmp/evil\n")
    env_file.chmod(0o600)
    env = dict(os.environ, LAUNCH_EXIT_DIR=str(tmp_path), RANK="1", LAUNCH_HOST="node1",
               LAUNCH_ENV_FILE=str(env_file), LAUNCH_ENV_NAMES="HF_TOKEN")
    env.pop("PYTHONPATH", None)
    show = "import os; print('SEEN', os.environ.get('HF_TOKEN'), os.environ.get('LD_PRELOAD'), " \
           "os.environ.get('PYTHONPATH'))"
    r = subprocess.run(["bash", WRAPPER, sys.executable, "-c", show], env=env, capture_output=True, text=True,
                       timeout=30)
    assert "SEEN abc None None" in r.stdout, r.stdout + r.stderr
    env_file.unlink()
    env_file.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("HF_TOKEN=abc\n")
    r = subprocess.run(["bash", WRAPPER, sys.executable, "-c", show], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "as a regular file of yours" in r.stderr and "SEEN" not in r.stdout, r.stderr

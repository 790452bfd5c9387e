"""The tests' command template (tests/support/forkserver.py) runs `python -m MODULE ...` as a fresh interpreter
would: the same output and exit code, the caller's environment (replaced whole), working directory and umask, and a
timeout that kills the command; the template then serves the next one."""
import json
import os
import signal
import subprocess
import time

import pytest

from tests.support import forkserver
from tests.support.runs import recipes_cli, worker_env

pytestmark = pytest.mark.multiproc

PROBE = """import json, os, sys, time
print(json.dumps({"env": os.environ.get("PROBE"), "home": "HOME" in os.environ, "cwd": os.getcwd(),
                  "umask": os.umask(0), "argv": sys.argv[1:], "main": __name__}))
if sys.argv[1:] == ["sleep"]:
    open("pid", "w").write(str(os.getpid()))
    time.sleep(600)
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else sys.argv[1] if sys.argv[1:] else 0)
"""


def test_output_and_exit_codes_are_a_fresh_interpreters():
    for argv in (["--version"], ["no-such-command"], ["plan", "models/tiny", "--nodes", "0"]):
        forked, fresh = recipes_cli(argv), recipes_cli(argv, fresh=True)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert recipes_cli(["no-such-command"]).returncode == 2


def test_the_command_gets_the_callers_environment_cwd_umask_and_exit_code(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    env = {k: v for k, v in worker_env().items() if k != "HOME"} | {"PROBE": "seen"}
    old = os.umask(0o027)
    try:
        r = forkserver.run(["7", "x"], env, tmp_path, timeout=60, module="probe_module")
    finally:
        os.umask(old)
    assert r.returncode == 7, r.stderr
    assert json.loads(r.stdout) == {"env": "seen", "home": False, "cwd": str(tmp_path), "umask": 0o027,
                                    "argv": ["7", "x"], "main": "__main__"}
    r = forkserver.run(["a message"], env, tmp_path, timeout=60, module="probe_module")
    assert (r.returncode, r.stderr) == (1, "a message\n")  # sys.exit("a message"), as the interpreter shows it


def test_a_command_past_its_timeout_is_killed_and_the_next_one_runs(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(["sleep"], worker_env(), tmp_path, timeout=5, module="probe_module")
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    assert recipes_cli(["--version"]).returncode == 0


def test_an_interrupted_command_is_killed_and_the_next_one_gets_its_own_answer(tmp_path):
    """pytest-timeout's alarm (or Ctrl-C) raising while a command runs: the command is killed and the next command
    reads its own exit code and output, not the abandoned one's (a fresh template answers it)."""
    (tmp_path / "probe_module.py").write_text(PROBE)
    assert forkserver.run(["0"], worker_env(), tmp_path, timeout=120, module="probe_module").returncode == 0  # warm

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(3)
    try:
        with pytest.raises(KeyboardInterrupt):
            forkserver.run(["sleep"], worker_env(), tmp_path, timeout=60, module="probe_module")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    r = forkserver.run(["5"], worker_env(), tmp_path, timeout=120, module="probe_module")
    assert r.returncode == 5 and json.loads(r.stdout)["argv"] == ["5"]

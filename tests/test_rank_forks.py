"""The launcher tests' forking venv (tests/support/rank_forks.py) against the real interpreter: a command forked from
the template must look, to its parent, its children and whoever reads /proc, like the interpreter it replaces."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import rank_forks

pytestmark = pytest.mark.multiproc

REAL = sys.executable
PROBE = r'''
import json, os, signal, sys, time
mode = os.environ.get("PROBE_MODE", "")
if mode == "wait":  # until a signal; SIGTERM exits 7, SIGUSR2 is answered on stdout
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    signal.signal(signal.SIGUSR2, lambda *_: print("usr2", flush=True))
    print(os.getpid(), flush=True)
    while True:
        time.sleep(0.05)
if mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "message":
    sys.exit("a message for stderr")
if mode == "fd":
    os.write(int(sys.argv[1]), b"through the inherited descriptor")
    sys.exit(0)
umask = os.umask(0)
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "umask": umask, "path0": sys.path[0], "name": __name__,
    "env": os.environ.get("PROBE_VALUE"), "term": signal.getsignal(signal.SIGTERM) == signal.SIG_IGN,
    "int": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "cmdline": [a.decode() for a in open("/proc/self/cmdline", "rb").read().split(b"\0")[1:] if a],
    "environ": b"PROBE_VALUE=" + os.environ.get("PROBE_VALUE", "").encode() in
               open("/proc/self/environ", "rb").read().split(b"\0"),
}), flush=True)
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("PROBE_CODE", "0")))
'''


@pytest.fixture(scope="module")
def fork_python():
    return str(rank_forks.venv() / "bin" / "python")


@pytest.fixture
def probe(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return str(path)


def _both(cmd_tail, fork_python, **kw):
    """(the real interpreter's result, the fork's)."""
    return [subprocess.run([py, *cmd_tail], capture_output=True, text=True, timeout=60, **kw)
            for py in (REAL, fork_python)]


def test_a_forked_script_sees_what_a_fresh_interpreter_sees(fork_python, probe, tmp_path):
    env = dict(os.environ, PROBE_VALUE="a b=c", PROBE_CODE="3")

    def as_started():
        os.umask(0o027)

    real, fork = _both(["-u", probe, "one", "two words"], fork_python, env=env, cwd=tmp_path, preexec_fn=as_started)
    assert (fork.returncode, fork.stderr) == (real.returncode, real.stderr) == (3, "to stderr\n")
    assert json.loads(fork.stdout) == json.loads(real.stdout)
    seen = json.loads(fork.stdout)
    assert seen["cmdline"] == ["-u", probe, "one", "two words"] and seen["environ"]
    marker = "import sys; print('torch' in sys.modules)"  # (`-c` is not forked: a fresh interpreter, no torch)
    assert subprocess.run([fork_python, "-c", marker], capture_output=True, text=True).stdout == "False\n"


def test_a_fork_is_really_a_fork(fork_python, probe, tmp_path):
    script = tmp_path / "imports.py"
    script.write_text("import sys; print('deepspeed' in sys.modules, 'megatron.core' in sys.modules)")
    assert subprocess.run([fork_python, str(script)], capture_output=True, text=True).stdout == "True True\n"


@pytest.mark.parametrize("mode, code", [("kill", -9), ("message", 1)])
def test_exit_statuses_are_the_interpreters(fork_python, probe, mode, code):
    real, fork = _both([probe], fork_python, env=dict(os.environ, PROBE_MODE=mode))
    assert fork.returncode == real.returncode == code
    assert fork.stderr == real.stderr


def test_signals_reach_the_fork_and_a_killed_shim_takes_it_along(fork_python, probe):
    env = dict(os.environ, PROBE_MODE="wait")
    shim = subprocess.Popen([fork_python, probe], env=env, stdout=subprocess.PIPE, text=True)
    pid = int(shim.stdout.readline())
    assert pid != shim.pid
    assert b"probe.py" not in Path(f"/proc/{shim.pid}/cmdline").read_bytes()  # only the fork looks like the command
    assert b"probe.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    shim.send_signal(signal.SIGUSR2)
    assert shim.stdout.readline() == "usr2\n"
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(timeout=30) == 7

    shim = subprocess.Popen([fork_python, probe], env=env, stdout=subprocess.PIPE, text=True)
    pid = int(shim.stdout.readline())
    shim.kill()
    assert shim.wait(timeout=30) == -signal.SIGKILL
    deadline = time.time() + 10
    while Path(f"/proc/{pid}").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the fork outlived its shim"


def test_ignored_signals_and_descriptors_are_inherited(fork_python, probe):
    def ignore_term():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    real, fork = _both([probe], fork_python, preexec_fn=ignore_term)
    assert json.loads(fork.stdout)["term"] and json.loads(real.stdout)["term"]
    r, w = os.pipe()
    try:
        done = subprocess.run([fork_python, probe, str(w)], env=dict(os.environ, PROBE_MODE="fd"), pass_fds=[w],
                              timeout=60)
        os.close(w)
        w = None
        assert done.returncode == 0
        assert os.read(r, 100) == b"through the inherited descriptor"
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


def test_torchrun_runs_forked(fork_python):
    torchrun = str(Path(fork_python).with_name("torchrun"))
    real = subprocess.run([str(Path(REAL).with_name("torchrun")), "--help"], capture_output=True, text=True)
    fork = subprocess.run([torchrun, "--help"], capture_output=True, text=True)
    assert fork.returncode == real.returncode == 0
    assert fork.stderr == "" and "--nproc-per-node" in fork.stdout

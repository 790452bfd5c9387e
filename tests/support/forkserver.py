"""`python -m recipes ...` (or another module) for the tests, forked from one pre-imported template process per pytest process.

Each `python -m recipes train --local N` (or reshape, export-hf, ...) imports torch, DeepSpeed and megatron-core
(~8 s of one core here) before a few seconds of work, and the tests run such commands over a hundred times. The
template imports them once, the way the --local launcher's own template does for its ranks
(recipes.train.local_ranks.prepare_template), and each command is a fork of it that becomes the command: its argv,
its environment (replaced whole), working directory, umask, stdin /dev/null, stdout and stderr the caller's files,
fresh random seeds, the module run as `__main__` (runpy, as `-m` does), and it leaves with its exit code after the
exit handlers, as the interpreter would. The template is single-threaded (no library it imports starts a thread: test_local_fork checks
it), so each fork may in turn fork its ranks.

What only a fresh interpreter shows stays on `subprocess`: import-time output (test_library_noise), the launcher's
own template (test_local_fork), and every test that signals or kills a launcher it started with Popen.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests.support.rank_forks import exit_as_interpreter

REPO = Path(__file__).resolve().parents[2]
_lock = threading.Lock()
_client: "socket.socket | None" = None
_server: "subprocess.Popen | None" = None


def run(argv: list[str], env: dict, cwd, timeout: float, module: str = "recipes") -> subprocess.CompletedProcess:
    """`python -m MODULE ARGV` forked from the template; like subprocess.run(..., capture_output=True, text=True,
    timeout=timeout): TimeoutExpired after killing the command."""
    args = [sys.executable, "-m", module, *argv]
    with _lock, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        conn = _connect()
        umask = os.umask(0o022)
        os.umask(umask)
        request = {"module": module, "argv": argv, "env": env, "cwd": str(cwd), "umask": umask}
        pid = None
        try:
            conn.settimeout(timeout)  # a template just started answers after its imports
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [out.fileno(), err.fileno()])
            reader = conn.makefile("r")
            pid = json.loads(reader.readline())["pid"]
            line = reader.readline()
        except TimeoutError:
            _reset(pid)
            raise subprocess.TimeoutExpired(args, timeout, _read(out), _read(err)) from None
        except BaseException:  # pytest-timeout's alarm, Ctrl-C, a broken template: never leave it mid-request
            _reset(pid)
            raise
        conn.settimeout(None)
        if not line:
            _reset(pid)
            raise RuntimeError("the test command template process died; see the test output")
        return subprocess.CompletedProcess(args, json.loads(line)["code"], _read(out), _read(err))


def _reset(pid: int | None) -> None:
    """Kill the command; the template reaps it and answers with its exit code, which is read and dropped here. If it
    does not answer (or the command never got a pid), the template is killed too and the next command starts a fresh
    one: the protocol is one request, one pid line, one exit-code line, and must never be left out of step."""
    global _client, _server
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            _client.settimeout(30)
            if _client.makefile("r").readline():  # (a reader that timed out cannot be read again: a new one)
                _client.settimeout(None)
                return
        except OSError:
            pass
    if _server is not None:
        _server.kill()
        _server.wait()
    if _client is not None:
        _client.close()
    _client = _server = None


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def _connect() -> socket.socket:
    global _client, _server
    if _client is not None and _server.poll() is not None:
        _reset(None)  # the template died: a fresh one
    if _client is None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
        _server = subprocess.Popen([sys.executable, "-c", "import sys; from tests.support.forkserver import serve; "
                                    f"serve({theirs.fileno()})"], pass_fds=[theirs.fileno()], cwd=REPO, env=env,
                                   stdin=subprocess.DEVNULL)
        theirs.close()
        _client = ours
    return _client


@atexit.register
def _stop() -> None:
    if _client is not None:
        _client.close()  # the template leaves when its socket closes
    if _server is not None:
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()


def serve(fd: int) -> None:
    """The template: import what every command needs, then fork one command per request until the socket closes."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the test process
    from recipes.train import cli, local_ranks

    problem = local_ranks.prepare_template(cli._before_rank_imports)
    assert problem is None, f"the test template cannot fork commands: {problem}"
    conn = socket.socket(fileno=fd)
    while True:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
        if not msg:
            return
        while not msg.endswith(b"\n"):
            msg += conn.recv(1 << 20)
        sys.stdout.flush()
        sys.stderr.flush()  # nothing buffered here may be written again by the command
        pid = _fork_command(json.loads(msg), fds, conn)
        for f in fds:
            os.close(f)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _fork_command(request: dict, fds: list[int], conn: socket.socket) -> int:
    pid = os.fork()
    if pid:
        return pid

    def command() -> None:
        conn.close()  # the template's end: only the template may hold it (the tests wait on it)
        import ctypes
        import random
        import runpy

        import numpy
        import torch

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # the template gone (the tests ended): stop like a pre-emption
        devnull = os.open(os.devnull, os.O_RDONLY)
        for src, dst in ((devnull, 0), (fds[0], 1), (fds[1], 2)):
            os.dup2(src, dst)
        for fd in (devnull, *fds):
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()  # a fresh interpreter's seeds; torch's default generator starts from the same seed anyway
        numpy.random.seed()
        torch.manual_seed(torch.initial_seed())
        sys.argv = ["-m", *request["argv"]]  # as `python -m MODULE ARGV` sees them (runpy sets argv[0])
        sys.path.insert(0, request["cwd"])  # `-m` puts the working directory first
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)

    exit_as_interpreter(command)

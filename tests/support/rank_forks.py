"""A venv for the launcher tests whose `python` and `torchrun` fork their command from one pre-imported template.

A launcher test starts the real launcher, sshd "nodes", torchrun or DeepSpeed's launchers, rank_exec.sh and ranks;
each torchrun, DeepSpeed launcher and rank used to be a fresh interpreter importing torch (and DeepSpeed and
megatron-core): ~2-5 s of CPU each, ~60% of the launcher tests' CPU. `venv()` makes a directory that stands in for
the repository's .venv (LAUNCH_VENV, which the launcher and every node honour): bin/python and bin/torchrun are
tests/support/fork_python.py, the rest of bin/ links to the real venv. What they run comes from `serve`, a template
process with those libraries imported (as recipes.train.local_ranks prepares the --local launcher's own).

A fork becomes the command the way a fresh interpreter would be: the shim's argv, environment, working directory,
umask, open file descriptors (at the same numbers), ignored signals, fresh random seeds; `-m MODULE` or a script run as
`__main__`; exit handlers run; the exit code (or the killing signal) handed back. /proc/PID/cmdline and environ show
the command's own (the template starts with room for them), so tests that find a rank there find the fork. A fork is
in a process group of its own, its parent is the template, and it dies with the template (PR_SET_PDEATHSIG).
tests/test_rank_forks.py checks each of these against the real interpreter.
"""
from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REAL_BIN = Path(sys.executable).parent
ARGV_ROOM = 32 * 1024  # bytes of /proc/PID/cmdline and environ a fork can fill (one argument may not exceed 128 KiB)
ENV_ROOM = 120 * 1024
allowed = True  # tests/conftest.py: not in the unit tier
_venv: Path | None = None
_server: subprocess.Popen | None = None


def venv() -> Path:
    """The forking venv of this test process, made (and its template started) on first use."""
    global _venv, _server
    if _venv is not None and _server is not None and _server.poll() is None:
        return _venv
    root = Path(tempfile.mkdtemp(prefix="fork-venv-"))
    (root / "bin").mkdir()
    for entry in REAL_BIN.iterdir():
        if entry.name not in ("python", "torchrun"):
            (root / "bin" / entry.name).symlink_to(entry)
    shim = (f"#!{REAL_BIN / 'python'} -IS\nREAL_BIN = {str(REAL_BIN)!r}\nSOCKET = {str(root / 'fork.sock')!r}\n"
            + (REPO / "tests" / "support" / "fork_python.py").read_text())
    for name in ("python", "torchrun"):
        (root / "bin" / name).write_text(shim)
        (root / "bin" / name).chmod(0o755)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", FORK_ENV_ROOM="x" * ENV_ROOM)
    ready_r, ready_w = os.pipe()
    _server = subprocess.Popen([str(REAL_BIN / "python"), "-c", "from tests.support.rank_forks import serve; "
                                f"serve({str(root / 'fork.sock')!r}, {ready_w})", "x" * ARGV_ROOM],
                               cwd=REPO, env=env, stdin=subprocess.DEVNULL, pass_fds=[ready_w], start_new_session=True)
    os.close(ready_w)
    with os.fdopen(ready_r, "rb") as ready:
        if ready.read() != b"ready":
            raise RuntimeError("the launcher tests' fork template did not start; see the test output")
    _venv = root
    return root


def python() -> str:
    """This venv's python, for a test that runs a command whose steps are `python -m recipes ...` (the main job:
    each `-m recipes` and `-m data_prep` step forked, ~3-5 s of CPU less each)."""
    return str(venv() / "bin" / "python")


@atexit.register
def _stop() -> None:
    if _server is not None and _server.poll() is None:
        _server.kill()  # its forks die with it (PR_SET_PDEATHSIG)
        _server.wait()
    if _venv is not None:
        shutil.rmtree(_venv, ignore_errors=True)


def serve(path: str, ready_fd: int) -> None:
    """The template: import what the forked commands need, then fork one per connection, forward the signals its
    shim sends, and answer each with the fork's exit code; a shim gone (EOF) takes its fork with it (SIGKILL)."""
    import ctypes
    import importlib
    import warnings

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the test process
    fresh_filters = list(warnings.filters)
    from recipes.train import cli, local_ranks

    problem = local_ranks.prepare_template(cli._before_rank_imports)
    for name in ("torch.distributed.run", "deepspeed.launcher.launch", "deepspeed.launcher.runner", "launch.commcheck"):
        importlib.import_module(name)  # what they import stays; they themselves run afresh as __main__, as `-m` would
        del sys.modules[name]
    problem = problem or local_ranks.fork_problem()
    assert problem is None, f"the launcher tests' template cannot fork: {problem}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    forks: dict[int, socket.socket | None] = {}  # pid -> its shim's connection (None once the shim is gone)
    os.write(ready_fd, b"ready")
    os.close(ready_fd)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                pid = _start(conn, listener, sel, fresh_filters)
                if pid:
                    forks[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, pid)
            elif key.fileobj == wake_r:
                os.read(wake_r, 4096)
                _reap(forks, sel)
            else:
                _from_shim(key.fileobj, key.data, forks, sel)


def _start(conn: socket.socket, listener, sel, fresh_filters) -> int | None:
    try:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 253)
        while msg and not msg.endswith(b"\n"):
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            msg += chunk
        request = json.loads(msg)
    except (OSError, ValueError):
        conn.close()
        return None
    if len(b"\0".join(s.encode() for s in request["cmdline"])) >= ARGV_ROOM or \
            len(b"\0".join(f"{k}={v}".encode() for k, v in request["env"].items())) >= ENV_ROOM:
        for fd in fds:
            os.close(fd)
        conn.sendall(b'{"fallback": "no room for its command line or environment"}\n')
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered here may be written again by the fork
    pid = os.fork()
    if pid == 0:
        _become(request, fds, fresh_filters)  # never returns
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _from_shim(conn: socket.socket, pid: int, forks: dict, sel) -> None:
    try:
        data = conn.recv(4096)
    except OSError:
        data = b""
    if not data:  # the shim died: so does its fork, as a process killed by SIGKILL would
        sel.unregister(conn)
        conn.close()
        forks[pid] = None
        _signal(pid, signal.SIGKILL)
        return
    for line in data.split():
        _signal(pid, int(line))


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _reap(forks: dict, sel) -> None:
    while forks:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        conn = forks.pop(pid, None)
        if conn is not None:
            sel.unregister(conn)
            try:
                conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass
            conn.close()


def _become(request: dict, fds: list[int], fresh_filters: list) -> None:
    """In the fork: become `python ... ARGV` as the shim was started, then exit as that interpreter would."""

    def command() -> None:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the template gone (the tests ended)
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                  signal.SIGALRM, signal.SIGINT):
            default = signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL
            signal.signal(s, signal.SIG_IGN if int(s) in request["ignored"] else default)
        _take_fds(request["fds"], fds)
        _set_proc_blocks(request["cmdline"], request["env"])
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.update(request["env"])  # (_set_proc_blocks cleared it)
        _fresh_streams(request["unbuffered"] or bool(request["env"].get("PYTHONUNBUFFERED")))
        _fresh_state(request, fresh_filters)
        _run(request)

    exit_as_interpreter(command)


def exit_as_interpreter(command) -> None:
    """Run command() in a fork and leave as the interpreter leaves after its program: SystemExit's code (an int is
    the code, None is 0, anything else is printed and gives 1), a traceback and 1 for any other exception, the exit
    handlers run and the streams flushed. Never returns."""
    code = 1
    try:
        command()
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError, AttributeError):
                    pass
            os._exit(code if isinstance(code, int) else 1)


def _take_fds(targets: list[int], received: list[int]) -> None:
    """Close every descriptor of the template's (the listener, other shims' connections), then put the shim's at the
    numbers it had them."""
    top = max([*targets, *(int(n) for n in os.listdir("/proc/self/fd"))]) + 1
    import fcntl

    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, top) for fd in received]
    os.closerange(0, top)
    for target, fd in zip(targets, moved):
        os.dup2(fd, target)
    for fd in moved:
        os.close(fd)


def _set_proc_blocks(cmdline: list[str], env: dict) -> None:
    """Write the command's argv and environment where /proc/PID/cmdline and environ read them (the template started
    with ARGV_ROOM and ENV_ROOM there; libc's environment is cleared first, it points into that block)."""
    import ctypes

    os.environ.clear()
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(f) for f in fields[45:49])
    for (start, end), block in (((arg_start, arg_end), b"\0".join(s.encode() for s in cmdline) + b"\0"),
                                ((env_start, env_end), b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))):
        ctypes.memset(start, 0, end - start)
        ctypes.memmove(start, block, min(len(block), end - start))


def _fresh_streams(unbuffered: bool) -> None:
    """stdin/stdout/stderr over descriptors 0-2, buffered as a fresh interpreter's would be."""
    import io

    def stream(fd: int, mode: str):
        try:
            os.fstat(fd)
        except OSError:
            return None
        raw = io.FileIO(fd, mode, closefd=False)
        if mode == "r":
            return io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8")
        tty = raw.isatty()
        binary = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(binary, encoding="utf-8", errors="backslashreplace" if fd == 2 else "strict",
                                line_buffering=tty or fd == 2, write_through=unbuffered)

    sys.stdin, sys.stdout, sys.stderr = stream(0, "r"), stream(1, "w"), stream(2, "w")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _fresh_state(request: dict, fresh_filters: list) -> None:
    import random
    import warnings

    import numpy
    import torch

    warnings.filters[:] = fresh_filters
    if request["env"].get("PYTHONWARNINGS"):
        for spec in request["env"]["PYTHONWARNINGS"].split(","):
            warnings._setoption(spec)
    random.seed()  # a fresh interpreter's seeds; torch's default generator starts from the same seed anyway
    numpy.random.seed()
    torch.manual_seed(torch.initial_seed())
    sys.executable = request["exe"]
    sys.orig_argv = [request["exe"], *request["cmdline"][1:]]


def _run(request: dict) -> None:
    import runpy

    if "module" in request:
        sys.argv = ["-m", *request["argv"]]  # runpy puts the module's path in argv[0], as `-m` does
        sys.path[0] = request["cwd"]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [request["script"], *request["argv"]]
        sys.path[0] = os.path.dirname(request["script"])
        runpy.run_path(request["script"], run_name="__main__")


def _exit_code(e: SystemExit) -> int:
    if isinstance(e.code, int):
        return e.code
    if e.code is not None:
        print(e.code, file=sys.stderr)
        return 1
    return 0

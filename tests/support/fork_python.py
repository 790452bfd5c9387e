"""The `python` (and `torchrun`) of the launcher tests' venv (tests/support/rank_forks.py): a rank, torchrun or a
DeepSpeed launcher forked from a template that has torch, DeepSpeed and megatron-core imported, instead of a fresh
interpreter that spends ~2-5 s of CPU importing them.

This file is copied into that venv's bin/ under a `#!<the real python> -IS` line and a header that sets REAL_BIN (the
real venv's bin/) and SOCKET (the template's). It stays the process its parent started: it hands the template its
argv, environment, working directory, umask, open file descriptors and ignored signals; forwards every signal it
gets to the fork; and ends as the fork ended (its exit code, or killed by the same signal). If it dies (SIGKILL), the
template kills the fork. It renames itself in /proc/PID/cmdline so that only the fork looks like the rank.

Anything it does not fork (another module, `-c`, flags it does not know, no template) runs on the real interpreter,
exec'd in place.
"""
import json
import os
import signal
import socket
import sys

REAL_BIN = globals().get("REAL_BIN", "")
SOCKET = globals().get("SOCKET", "")
# What is worth a fork: the commands that import torch (data_prep's verify and stats import megatron-core's reader;
# the main job's demo 46.6 -> 31.8 s of CPU when they fork too). The launcher itself and its probes import little.
MODULES = {"recipes", "data_prep", "torch.distributed.run", "deepspeed.launcher.launch", "deepspeed.launcher.runner",
           "launch.commcheck"}
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGALRM)


def parse(name: str, args: list[str]) -> dict | None:
    """What to run, as `python ARGS` (or `torchrun ARGS`) would; None for anything this does not fork."""
    if name == "torchrun":
        return {"module": "torch.distributed.run", "argv": args, "unbuffered": False}
    unbuffered = False
    while args and args[0] == "-u":
        unbuffered, args = True, args[1:]
    if len(args) >= 2 and args[0] == "-m" and args[1] in MODULES:
        return {"module": args[1], "argv": args[2:], "unbuffered": unbuffered}
    if args and args[0].endswith(".py") and not args[0].startswith("-"):
        return {"script": os.path.abspath(args[0]), "argv": args[1:], "unbuffered": unbuffered}
    return None


def open_fds(skip: int) -> list[int]:
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd != skip:
            try:
                os.fstat(fd)  # (the listing's own descriptor is closed by now)
                fds.append(fd)
            except OSError:
                pass
    return sorted(fds)


def rename_self() -> None:
    """Overwrite this process's argv area: tests and tools that look for the rank by its command line find the fork."""
    import ctypes

    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49 of proc(5))
    title = b"fork-python (the rank is a fork of the launcher tests' template)"[:end - start - 1]
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, title, len(title))


def exec_real(name: str, args: list[str]) -> None:
    path = os.path.join(REAL_BIN, name)
    os.execv(path, [path, *args])


def main() -> None:
    name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
    request = parse(name, list(args))
    if request is None:
        exec_real(name, args)
    rename_self()  # (an exec of the real interpreter below gets its own command line back)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(SOCKET)
    except OSError:
        exec_real(name, args)
    ignored = [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]
    fds = open_fds(conn.fileno())
    umask = os.umask(0o022)
    os.umask(umask)
    request.update(exe=os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "python"),
                   cmdline=[sys.argv[0], *args], env=dict(os.environ), cwd=os.getcwd(), umask=umask, fds=fds,
                   ignored=ignored)
    socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)

    def forward(signum, _frame):
        try:
            conn.sendall(b"%d\n" % signum)
        except OSError:
            pass

    for s in FORWARDED:
        if int(s) not in ignored:
            signal.signal(s, forward)
    reader = conn.makefile("rb")
    answer = json.loads(reader.readline() or b"{}")
    if "fallback" in answer:  # the template cannot take this one (say, an environment larger than it has room for)
        conn.close()
        exec_real(name, args)
    line = reader.readline()
    code = json.loads(line)["code"] if line else -signal.SIGKILL  # no answer: the template died, and the fork with it
    if code < 0:  # killed by a signal: so is this process, so that its parent sees the same status
        for s in FORWARDED:
            signal.signal(s, signal.SIG_IGN)
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


if __name__ == "__main__":
    main()

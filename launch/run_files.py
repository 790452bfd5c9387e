"""The run directory (the launcher's --log-dir) on a shared file system: trusted only when nobody else can change it,
its files written whole under fresh names and read back without following links or blocking.

Why: the launcher and the ranks read files from there (the env file, launch.env, job.sbatch, exit records,
heartbeats, hang verdicts). A directory another user, or a member of its group, can write to lets them plant a link
where the launcher writes (it would write through it), swap a file between its write and its use (job.sbatch,
secret.env), or leave a FIFO or a link to /dev/zero where the launcher reads (it would hang). Neither the directory
nor any directory above it may be writable by others without the sticky bit (sticky: others cannot rename or remove
what is ours, /tmp's case), or owned by someone else than the user or root (its owner can change it at will).
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from launch.common import LaunchError
from recipes.config.file_mode import current as recipe_mode

MAX_READ = 1 << 20  # run files are small; a bigger one is not ours


def check_trusted_dir(path: Path) -> None:
    """LaunchError (exit 2, with the fix) when `path` or a directory above it is not the user's alone."""
    me = os.geteuid()
    path = Path(os.path.abspath(path))
    for d in [path, *path.parents]:
        st = d.lstat()
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (me, 0):
            raise LaunchError(f"the log dir {path}: {d} belongs to another user (uid {st.st_uid}), who could change "
                              "the run's files: use a directory of your own (--log-dir under your home or scratch)", 2)
        shared = mode & (stat.S_IWGRP | stat.S_IWOTH)
        if shared and (d == path or not mode & stat.S_ISVTX):
            who = "other users" if mode & stat.S_IWOTH else "its group"
            where = f"the log dir {path}" if d == path else f"the log dir {path}: {d}"
            raise LaunchError(f"{where} is writable by {who} (mode {mode:04o}): files planted or swapped there would "
                              f"be trusted by this run; `chmod go-w {d}`, or use --log-dir somewhere only you can "
                              "write to", 2)


def make_private_dir(path: Path) -> Path:
    """Create the run directory (and missing parents) writable by the user alone, then check it and what is above."""
    old = os.umask(0o022)
    os.umask(old | 0o022)  # the recipe's mode (checkpoint.file_mode's umask), never group- or world-writable
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as e:
        raise LaunchError(f"cannot create the log dir {path}: {e.strerror}; give --log-dir a directory you can "
                          "write") from None
    finally:
        os.umask(old)
    check_trusted_dir(path)
    return path


def write(path: Path, text: str, private: bool = True) -> None:
    """`text` into `path`: written under a fresh unpredictable name in the same directory (created exclusively, 0600,
    never through a planted file or link) and renamed over `path`. `private=False` (plans, host lists, launch.env):
    then given the run's data mode (checkpoint.file_mode, else 0644), never writable by the group or others."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if not private:
                os.fchmod(f.fileno(), (recipe_mode() or 0o644) & ~0o022)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(path: Path, limit: int = MAX_READ) -> str:
    """A run file's text: a regular file, not followed through a link, opened without blocking (a FIFO planted there
    cannot hang the reader), at most `limit` bytes. OSError (ELOOP, ENOENT, ...) or ValueError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes: not a file of this run")
    return data.decode("utf-8", errors="replace")

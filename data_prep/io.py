"""File access for data_prep: every open, size, time stamp and atomic write of inputs and outputs goes through here.

Paths are local POSIX paths or URLs (``s3://``, ``gs://``, ``file://``, anything fsspec knows): the functions take
path strings and return file objects, so the readers, the planner and the writers do not care where a file lives.
URLs go through fsspec (objstore.py): reads are ranged GETs, and outputs are written locally first and then
uploaded whole (``publish``), because an object store has no rename.

Atomic writes: the data goes to a temporary name next to the target, is fsynced, renamed over the target, and the
directory is fsynced, so a crash leaves the old file or the new one, never a torn one, and the rename itself survives
a power cut.
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import socket
from typing import BinaryIO, Union

from data_prep import file_modes, objstore
from data_prep.objstore import check_url, configure, is_url, join, list_tree, refresh_listing  # noqa: F401  (the io API)

SIZE_UNITS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}


def parse_size(text: Union[str, int]) -> int:
    """'256M' = 256e6 bytes, '256Mi' = 256 x 2^20, '10P' = 1e16, plain digits = bytes; a trailing B is allowed.
    Raises ValueError naming the text and the accepted forms."""
    if isinstance(text, int):
        return text
    t = text.strip().lower()
    t = t[:-1] if t.endswith("b") else t
    binary = t.endswith("i")
    t = t[:-1] if binary else t
    try:
        if t and t[-1] in SIZE_UNITS:
            return int(float(t[:-1]) * (1024 if binary else 1000) ** SIZE_UNITS[t[-1]])
        return int(float(t))
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 64M, 1G, 10P, 512Mi)") from None


# --- reading -----------------------------------------------------------------------------------------------------


def abspath(path: str) -> str:
    """An absolute local path, or the URL unchanged (``file://`` URLs become local paths)."""
    path = objstore.local_path(path)
    return path if is_url(path) else os.path.abspath(path)


def exists(path: str) -> bool:
    return objstore.exists(path) if is_url(path) else os.path.exists(path)


def open_read(path: str, buffering: int = -1, block_size: int = 0) -> BinaryIO:
    """A binary file object for reading ``path``. URLs: ranged GETs of ``block_size`` bytes (0: the default read
    block), read ahead sequentially, so reading one byte range never downloads the whole object."""
    if is_url(path):
        return objstore.open_read(path, block_size)
    return open(path, "rb", buffering=buffering)


def size(path: str) -> int:
    """Bytes of a file, or of all files under a directory (a saved dataset)."""
    if is_url(path):
        return objstore.size(path)
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def mtime_ns(path: str) -> int:
    """Modification time of a file, or the newest of the files under a directory."""
    if is_url(path):
        return objstore.mtime_ns(path)
    if os.path.isdir(path):
        return max((os.stat(os.path.join(d, f)).st_mtime_ns for d, _, fs in os.walk(path) for f in fs), default=0)
    return os.stat(path).st_mtime_ns


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open_read(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- writing -----------------------------------------------------------------------------------------------------


DATA_MODE = None  # shards, indexes, manifests, logs: file_modes.data_mode() (0644 unless a file mode was set)
SECRET_MODE = 0o600  # anything holding credentials: the owner only


def open_write(path: str, mode: int | None = DATA_MODE) -> BinaryIO:
    """A new binary file for writing, created with ``mode`` (default: the run's data mode, 0644 unless
    --file-mode / checkpoint.file_mode set one; narrowed further by the umask, never widened: a umask of 0 does not
    make outputs world-writable). A leftover at ``path`` is replaced, not reused with its mode."""
    remove(path)
    if mode is None:
        mode = file_modes.data_mode()
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb")


def fsync_file(f, really: bool = True) -> None:
    """Flush a file object to the OS and (unless ``really`` is False) to the disk."""
    f.flush()
    if really:
        os.fsync(f.fileno())


def fsync_dir(path: str) -> None:
    """Make the renames in a directory durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_name(path: str, shared: bool = False) -> str:
    """The temporary name ``path`` is written under before its rename.

    A file with one writer gets a fixed name (a rerun overwrites the leftover of a killed one). A ``shared`` file
    (plan, manifest, reject log) may be written by several nodes at once: a name per writer (host, pid)."""
    return f"{path}.tmp.{socket.gethostname()}.{os.getpid()}" if shared else path + ".tmp"


def atomic_write(path: str, data: Union[bytes, str], shared: bool = False, fsync: bool = True,
                 mode: int | None = DATA_MODE) -> None:
    """Write ``data`` to ``path`` all or nothing: temporary file, fsync, rename over ``path``, fsync of the
    directory. ``shared``: several writers may race on ``path`` (see ``tmp_name``); the last rename wins whole.
    ``mode``: DATA_MODE (the run's data mode) for outputs; SECRET_MODE (0600) for anything holding credentials."""
    if isinstance(data, str):
        data = data.encode()
    if is_url(path):  # one PUT: the object appears whole or not at all
        objstore.write_bytes(path, data)
        return
    tmp = tmp_name(path, shared)
    try:
        with open_write(tmp, mode) as f:
            f.write(data)
            fsync_file(f, fsync)
        os.replace(tmp, path)
    except BaseException:
        remove(tmp)  # a full disk: no partial temporary file left behind
        raise
    if fsync:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write_many(items, shared: bool = False, mode: int | None = DATA_MODE) -> None:
    """``atomic_write`` of several local files, paying for one directory fsync per directory instead of one per file:
    each file is written and fsynced under its temporary name, then all are renamed, then their directories fsynced.
    A crash leaves each file old or new, whole; the caller writes its completion marker after this returns."""
    done = []
    try:
        for path, data in items:
            tmp = tmp_name(path, shared)
            done.append((tmp, path))
            with open_write(tmp, mode) as f:
                f.write(data)
                fsync_file(f, True)
        for tmp, path in done:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in done:
            remove(tmp)  # a full disk: no partial temporary file left behind
        raise
    for d in sorted({os.path.dirname(os.path.abspath(p)) for _, p in done}):
        fsync_dir(d)


def commit(tmp: str, path: str, fsync: bool = True) -> None:
    """Rename a finished (already fsynced) temporary file into place and make the rename durable."""
    os.replace(tmp, path)
    if fsync:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def publish(local: str, dest: str, fsync: bool = True) -> None:
    """Move a finished local file to ``dest``: a rename for a local ``dest``, an upload (multipart above the part
    size) and the removal of the local copy for a URL. The object is visible only once its upload completed."""
    if is_url(dest):
        objstore.upload(local, dest)
        os.remove(local)
    elif local != dest:
        commit(local, dest, fsync)


def replace_unless_identical(tmp: str, path: str) -> bool:
    """Move a finished ``tmp`` over ``path``, unless ``path`` already holds the same bytes: then keep it (and its
    mtime, which work-unit keys include, so a rerun that regenerates the same file resumes instead of redoing)."""
    if os.path.exists(path) and filecmp.cmp(tmp, path, shallow=False):
        os.remove(tmp)
        return False
    os.replace(tmp, path)
    return True


def remove(path: str) -> None:
    """Remove a file if it is there."""
    if is_url(path):
        objstore.remove(path)
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def remove_stale_tmp(out_dir: str) -> None:
    """Remove shared temporary files left by killed writers of this host (other hosts' files are left alone)."""
    if is_url(out_dir):  # nothing is written to an object store under a temporary name
        return
    host = socket.gethostname()
    for name in os.listdir(out_dir):
        head, sep, pid = name.rpartition(".")
        if not sep or not pid.isdigit() or not head.endswith(f".tmp.{host}"):
            continue
        path = os.path.join(out_dir, name)
        if _writer_gone(int(pid), path):
            remove(path)


def _writer_gone(pid: int, path: str) -> bool:
    """The process that wrote `path` under its pid is gone: no such pid, a zombie (killed, not yet reaped: a SIGKILLed
    run's workers wait for init to reap them, and a rerun started at once saw them 'alive'), or a process started
    after the file was last written (the pid was reused). Another user's live process is never taken for gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    stat = _proc_stat(pid)
    if stat is None:  # no /proc (not Linux), or the process ended meanwhile
        return not os.path.exists(f"/proc/{pid}") and os.path.isdir("/proc/self")
    state, started = stat
    return state in ("Z", "X") or started > os.path.getmtime(path) + 1.0


def _proc_stat(pid: int) -> tuple[str, float] | None:
    """(state letter, start time in seconds since the epoch) of process `pid` from Linux /proc; None where unread."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return fields[0], boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def check_writable(out_dir: str) -> None:
    """Create ``out_dir`` if needed and prove a file can be written there; PermissionError says what to do."""
    if is_url(out_dir):
        objstore.check_writable(out_dir)
        return
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PermissionError(f"output {out_dir} is a file, not a directory; choose another --output (a directory, "
                              "created when missing)")
    try:
        os.makedirs(out_dir, exist_ok=True)
        # one probe per writer: array tasks and hostfile slices check the same directory at once, and a shared name
        # let one remove the other's probe (ENOENT, reported as "not writable")
        probe = os.path.join(out_dir, f".write_probe.{socket.gethostname()}.{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.remove(probe)
    except OSError as e:
        raise PermissionError(f"output directory {out_dir} is not writable ({e.strerror}); choose another --output") from e

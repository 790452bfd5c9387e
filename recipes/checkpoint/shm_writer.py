"""The background half of an async save: one long-lived writer process per rank, fed through shared memory.

The rank copies each checkpoint file's tensors into `Arena` (anonymous shared memory, memfd, reused by every save:
after the first save no page is newly faulted in), pickles only the small structure around them (storages become
references into the arena), and hands that to `BackgroundWriter`'s process, which rebuilds the state dict over the
arena (no copy), torch.saves and fsyncs it. Only a few KiB cross the pipe.

Why not a process forked per save (what this replaced): after fork() every page the training process writes
(parameters, gradients, Adam moments, reused activations) is copied on write while the child lives, which slowed
the steps after an async save by more than the sync save cost (docs/cluster.md). The writer is instead either
forked once at the rank's start (`prefork`), before any model, optimizer or thread exists, so that the only pages
it shares are the imported libraries' (it needs torch: importing it again in a spawned process cost ~5 s of CPU per
rank per run), or, where that moment has passed or is unsafe (threads running, CUDA initialised), spawned. Why not
a thread: torch.save holds the GIL while it checksums and writes records.

The writer dies with its rank (PR_SET_PDEATHSIG, and it leaves when its pipe closes), is a daemon process (ended at
the rank's exit), ignores the pre-emption signals its rank handles (stop.sh and scancel signal every process of
the run: the stop save must still be written; SIGKILL after the grace still ends it) and reports every failure back
as {"error": ..., "errno": ...}; a writer that dies is reported as a failed save and replaced by a fresh one at the
next save. While its rank waits for a write (a stop, the end, the next save) the write goes uncapped.
"""
from __future__ import annotations

import io
import mmap
import multiprocessing
import os
import pickle
import signal
import time
from multiprocessing import reduction

import torch

_ALIGN = 64
_SEGMENT = 256 << 20  # arena grows by at least this much; tmpfs pages are only allocated once written


class Arena:
    """Shared-memory segments (memfd) that hold the tensors of one save; `reset()` at each save reuses them."""

    def __init__(self):
        self.segments: list[tuple[int, mmap.mmap]] = []  # (fd, mapping)
        self._seg, self._off = 0, 0

    def reset(self) -> None:
        self._seg, self._off = 0, 0

    def nbytes(self) -> int:
        return sum(len(m) for _, m in self.segments)

    def _alloc(self, n: int) -> tuple[int, int]:
        while self._seg < len(self.segments) and self._off + n > len(self.segments[self._seg][1]):
            self._seg, self._off = self._seg + 1, 0  # same shapes every save: the same fits, no new segment
        if self._seg == len(self.segments):
            size = max(n, _SEGMENT)
            fd = os.memfd_create(f"checkpoint-arena-{len(self.segments)}")  # close-on-exec, never on a file system
            os.ftruncate(fd, size)
            self.segments.append((fd, mmap.mmap(fd, size)))
        where = (self._seg, self._off)
        self._off += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        return where

    def view(self, seg: int, off: int, n: int) -> torch.Tensor:
        return torch.frombuffer(self.segments[seg][1], dtype=torch.uint8, count=n, offset=off)

    def pack(self, obj) -> bytes:
        """Copy every tensor of `obj` into the arena; the pickled rest, with storages as arena references. What
        `obj` shares stays shared (one storage copied once), so the writer's torch.save writes the same records."""
        return _ArenaPickler(self).dumps(obj)

    def close(self) -> None:
        for fd, m in self.segments:
            try:
                m.close()
            except BufferError:  # a tensor still views it: the mapping goes with the process
                pass
            os.close(fd)
        self.segments = []


class _ArenaPickler(pickle.Pickler):
    def __init__(self, arena: Arena):
        self.buf = io.BytesIO()
        super().__init__(self.buf, protocol=pickle.HIGHEST_PROTOCOL)
        self.arena, self.placed = arena, {}

    def dumps(self, obj) -> bytes:
        self.dump(obj)
        return self.buf.getvalue()

    def persistent_id(self, obj):
        # torch pickles a tensor as its TypedStorage + offset/shape/stride; only the storage needs a place
        if not isinstance(obj, torch.storage.TypedStorage):
            return None
        st = obj._untyped_storage
        key = st._cdata  # as torch.save keys storages: views of one buffer share it
        if key not in self.placed:
            n = st.nbytes()
            if n == 0:
                self.placed[key] = ("empty", len(self.placed))
            else:
                seg, off = self.arena._alloc(n)
                src = torch.empty(0, dtype=torch.uint8, device=st.device).set_(st)
                self.arena.view(seg, off, n).copy_(src)
                self.placed[key] = ("arena", seg, off, n)
        return (*self.placed[key], obj.dtype)


class _ArenaUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, segments: dict[int, mmap.mmap]):
        super().__init__(io.BytesIO(data))
        self.segments, self.storages = segments, {}

    def persistent_load(self, pid):
        *where, dtype = pid
        key = tuple(where)
        if key not in self.storages:  # one storage per place: torch.save sees the sharing the rank had
            if where[0] == "empty":
                self.storages[key] = torch.UntypedStorage(0)
            else:
                _, seg, off, n = where
                self.storages[key] = torch.frombuffer(self.segments[seg], dtype=torch.uint8, count=n,
                                                      offset=off).untyped_storage()
        return torch.storage.TypedStorage(wrap_storage=self.storages[key], dtype=dtype, _internal=True)


def unpack(data: bytes, segments: dict[int, mmap.mmap]):
    """The state dict `Arena.pack` made, its tensors viewing the arena (CPU, no copy)."""
    return _ArenaUnpickler(data, segments).load()


_preforked: tuple | None = None  # (process, connection, full-speed flag) from prefork(), until a writer adopts it


def _fork_is_safe() -> bool:
    """One thread (a lock held by another thread at the fork stays locked in the child) and no CUDA context."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return False
    return threads == 1 and not torch.cuda.is_initialized()


def prefork() -> bool:
    """Fork this rank's writer now, if this process is still single-threaded and without CUDA: call it at the rank's
    start, before the model exists. The next BackgroundWriter adopts it. False: it will be spawned instead."""
    global _preforked
    if _preforked is not None or not hasattr(os, "fork") or not _fork_is_safe():
        return False
    from recipes.checkpoint import writer  # noqa: F401  (what _serve imports: the child has it already)

    ctx = multiprocessing.get_context("fork")
    full_speed = ctx.Value("b", 0, lock=False)
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, os.getpid(), full_speed, conn), daemon=True,
                       name="checkpoint-writer")
    proc.start()
    child.close()
    _preforked = (proc, conn, full_speed)
    return True


class BackgroundWriter:
    """This rank's writer process (the one `prefork` made, else spawned now) and its arena. One write at a time."""

    def __init__(self, cpus: set[int] | None = None):
        global _preforked
        self.arena, self.cpus = Arena(), cpus
        self._proc = self._conn = None
        self._sent = 0  # arena segments the current process has
        adopted, _preforked = _preforked, None
        if adopted is not None:
            self._proc, self._conn, self._full_speed = adopted
            try:
                self._conn.send(("cpus", self.cpus))  # from now on it ignores the pre-emption signals
            except OSError:  # it died before it was needed (e.g. a stop during start-up): spawn one
                self._proc.join(timeout=5)
                self._start()
        else:
            self._start()

    def _start(self) -> None:
        if self._conn is not None:
            self._conn.close()
        ctx = multiprocessing.get_context("spawn")
        # set while the rank waits for the write (result(wait=True)): the throttle stops holding it back
        self._full_speed = ctx.Value("b", 0, lock=False)
        self._conn, child = ctx.Pipe()  # a socket pair: segments' file descriptors travel over it
        self._proc = ctx.Process(target=_serve, args=(child, os.getpid(), self._full_speed), daemon=True,
                                 name="checkpoint-writer")
        self._proc.start()
        child.close()
        self._conn.send(("cpus", self.cpus))
        self._sent = 0

    def submit(self, jobs: list[tuple[str, bytes]], foreground: list[str], tag_dir: str,
               max_bytes_per_s: float | None, digests: dict[str, str] | None = None, who: str | None = None) -> None:
        """Write `jobs` ((path, Arena.pack bytes)), fsync `foreground` files and the tag's directories, record the
        checksums (writer.write_tag)."""
        if not self._proc.is_alive():
            self._start()  # the last one died (and that save was reported failed)
        for i in range(self._sent, len(self.arena.segments)):
            fd, m = self.arena.segments[i]
            self._conn.send(("segment", i, len(m)))
            reduction.send_handle(self._conn, fd, self._proc.pid)
        self._sent = len(self.arena.segments)
        self._full_speed.value = 0
        self._conn.send(("write", jobs, foreground, tag_dir, max_bytes_per_s, digests, who))

    def result(self, wait: bool) -> dict | None:
        """The report of the submitted write ({"bytes": n} or {"error": ..., "errno": ...}); None while running.
        `wait`: the training waits for it, so the rest of the write goes uncapped."""
        if wait:
            self._full_speed.value = 1
        while True:
            try:
                if self._conn.poll(0.2 if wait else 0):
                    return self._conn.recv()
                if not self._proc.is_alive() and self._conn.poll(0):  # a report sent just before it ended
                    return self._conn.recv()
            except (EOFError, OSError):
                pass  # its end of the pipe closed: it is gone
            else:
                if self._proc.is_alive():
                    if not wait:
                        return None
                    continue
            self._proc.join()
            return {"error": f"checkpoint writer process ended with exit code {self._proc.exitcode}", "errno": None}

    def close(self, wait: bool = True) -> None:
        """Stop the writer (after its current write; `wait=False`: at once, the write abandoned) and free the
        arena."""
        if self._proc is not None and self._proc.is_alive() and not wait:
            self._proc.kill()
            self._proc.join()
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
            self._proc.join(timeout=30)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        if self._conn is not None:
            self._conn.close()
        self.arena.close()
        self._proc = self._conn = None


def _serve(conn, parent: int, full_speed, rank_end=None) -> None:
    """The writer process: map the arena segments it is sent, write what it is asked to, report, until told to stop
    or its rank is gone. `rank_end`: the rank's end of the pipe, inherited by a forked writer and closed here (else
    the writer would never see the pipe close when its rank is gone)."""
    # A pre-emption signals every process of the run; the rank turns it into a stop save that this process writes, so
    # once its rank owns it (the "cpus" message) it ignores those signals; it still ends with its rank (PDEATHSIG,
    # pipe closed) or by SIGKILL. Until then (a writer forked at the rank's start) they end it: a rank that stops
    # during start-up must not wait at its exit for a writer that ignores them (multiprocessing joins its daemons).
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL if rank_end is not None else signal.SIG_IGN)
    if rank_end is not None:
        rank_end.close()
    from recipes.checkpoint.writer import die_with_parent, write_tag

    die_with_parent(parent)
    torch.set_num_threads(1)
    segments: dict[int, mmap.mmap] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the rank closed its end
        if msg[0] == "cpus":  # sent once, first, by the writer's owner
            for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            if msg[1]:
                os.sched_setaffinity(0, msg[1])  # a core of its own: the training's cores stay the training's
            else:
                os.nice(19)  # sharing the training's cores: the steps go first, the write waits
        elif msg[0] == "segment":
            fd = reduction.recv_handle(conn)
            segments[msg[1]] = mmap.mmap(fd, msg[2])
            os.close(fd)
        elif msg[0] == "write":
            _, jobs, foreground, tag_dir, rate, digests, who = msg
            started = time.perf_counter()
            report = write_tag(((path, lambda data=data: unpack(data, segments)) for path, data in jobs),
                               foreground, tag_dir, rate, full_speed=lambda: full_speed.value, digests=digests,
                               who=who)
            report["seconds"] = time.perf_counter() - started
            conn.send(report)
        else:
            return

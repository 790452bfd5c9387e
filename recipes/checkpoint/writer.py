"""How checkpoint files reach the disk: DeepSpeed hands every file of a save to `FileEngine` (its checkpoint-engine
interface), which either writes it now (sync) or takes a host copy of it for a background thread (async). Either way
every file is fsynced before the save counts as written, so `complete.json` (recipes.checkpoint.store) only ever
vouches for files that are on the disk.

Why not DeepSpeed's own DecoupledCheckpointEngine (0.19.8): its pipeline engine never commits a decoupled save
(`PipelineEngine` calls `_take_model_step` directly, the commit lives in `DeepSpeedEngine.step`), it needs the
libaio fast writer (not buildable here: `AsyncIOBuilder().is_compatible()` is False), it does not fsync, and it hands
the live tensors to its writer process through shared memory instead of copying them. torch.distributed.checkpoint's
async_save writes DCP files, not DeepSpeed's, which export, reshape and resume read.

Why a copy: the next optimizer step changes the parameters and moments in place; the background thread writes the
copy, so the files are exactly the state of the save step (byte-identical to a sync save: `host_copy` keeps the
storage sharing of the original, so torch.save writes the same records).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import time
from pathlib import Path

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from data_prep.io import fsync_dir, fsync_file, open_write

log = logging.getLogger(__name__)


def host_copy(obj, memo: dict | None = None):
    """`obj` (a state dict: nested dicts/lists/tuples of tensors and plain values) with every tensor copied into fresh
    host memory. What `obj` shares stays shared in the copy (tensors viewing one flat buffer share one copied storage;
    an object referenced twice is copied once), so the copy pickles to the same records as the original."""
    memo = {} if memo is None else memo
    if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.Size, torch.dtype, torch.device)):
        return obj
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        st = t.untyped_storage()
        key = ("storage", st.device, st.data_ptr(), st.nbytes())
        if key not in memo:
            memo[key] = st.cpu() if st.device.type != "cpu" else st.clone()
        out = torch.empty(0, dtype=t.dtype).set_(memo[key], t.storage_offset(), t.size(), t.stride())
        if isinstance(obj, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=obj.requires_grad)
        elif obj.requires_grad:
            out.requires_grad_(True)
    elif isinstance(obj, dict):
        out = copy.copy(obj)  # keeps the type (OrderedDict) and attributes (a state dict's _metadata)
        for k, v in obj.items():
            out[k] = host_copy(v, memo)
    elif type(obj) in (list, tuple):
        out = type(obj)(host_copy(v, memo) for v in obj)
    else:  # small plain objects (sets, enums, DeepSpeed's loss scaler): a copy, not a reference
        out = copy.deepcopy(obj, memo.setdefault("deepcopy", {}))
    memo[id(obj)] = out
    memo.setdefault("originals", []).append(obj)  # keeps ids unique while the copy is made
    return out


class _Throttled:
    """A file whose writes average at most `bytes_per_s` (sleeps after each write until the average is met)."""

    def __init__(self, f, bytes_per_s: float):
        self.f, self.rate, self.sent, self.t0 = f, bytes_per_s, 0, time.monotonic()

    def write(self, data) -> int:
        n = self.f.write(data)
        self.sent += n
        ahead = self.sent / self.rate - (time.monotonic() - self.t0)
        if ahead > 0:
            time.sleep(ahead)
        return n

    def __getattr__(self, name):  # flush, seek, tell, fileno: the file's own
        return getattr(self.f, name)


def write_durably(obj, path: str | Path, zipfile: bool = True, max_bytes_per_s: float | None = None) -> int:
    """torch.save `obj` to `path` and fsync it (at most `max_bytes_per_s` when given); returns its size in bytes."""
    with open_write(str(path)) as f:
        torch.save(obj, _Throttled(f, max_bytes_per_s) if max_bytes_per_s else f,
                   _use_new_zipfile_serialization=zipfile)
        fsync_file(f)
        return f.tell()


class FileEngine(CheckpointEngine):
    """DeepSpeed's checkpoint-engine interface (`engine.checkpoint_engine`): DeepSpeed calls `save(state, path)` for
    every file of `save_checkpoint` on every rank. Between `collect()` and `take()` the files are host-copied and kept
    for a background writer; otherwise written and fsynced at once."""

    def __init__(self, zipfile: bool = True):
        super().__init__()
        self.name = "recipes.FileEngine"
        self.zipfile = zipfile
        self._pending: list[tuple[str, object]] | None = None
        self.written: list[str] = []  # files written (sync) since the last take()

    def collect(self) -> None:
        self._pending = []

    def take(self) -> tuple[list[tuple[str, object]] | None, list[str]]:
        """(host copies kept since collect(), or None when sync; paths written in the foreground)."""
        pending, written = self._pending, self.written
        self._pending, self.written = None, []
        return pending, written

    def save(self, state_dict, path: str) -> None:
        if self._pending is not None:
            self._pending.append((str(path), host_copy(state_dict)))
        else:
            write_durably(state_dict, path, self.zipfile)
            self.written.append(str(path))

    def create(self, info) -> None:
        pass

    def load(self, path: str, map_location=None):
        # recipes.checkpoint.safe_load.guard_engine replaces this with the allow-listed loader before any resume
        return torch.load(path, map_location=map_location, weights_only=True)

    def commit(self, info) -> bool:
        return True  # durability is ours: complete.json (recipes.checkpoint.store)


def install(engine) -> FileEngine:
    """Put a FileEngine in place of the engine's own (which writes without fsync), keeping its serialization."""
    current = engine.checkpoint_engine
    if isinstance(current, FileEngine):
        return current
    files = FileEngine(zipfile=getattr(current, "zipfile_serialization", True))
    engine.checkpoint_engine = files
    return files


class TagWrite:
    """The rest of one rank's save after DeepSpeed's `save_checkpoint` returned: write the host copies (if any),
    fsync the files written in the foreground, fsync the directories; `error` is set if that failed.

    `background=False`: now. `background=True`: in a forked child process, which inherits the host copies without
    pickling them (the parent drops its references at once: one copy in memory while the write is in flight). Why a
    process and not a thread: torch.save holds the GIL while it checksums and writes records, so a writer thread
    slowed the training steps 2.5x here; a forked writer did not measurably. The child only writes files and leaves
    with os._exit (no logging, no process group, no atexit handlers of the parent), and dies with its parent
    (PR_SET_PDEATHSIG): a run that is killed leaves no writer behind, and its tag no complete.json. It runs at nice
    19: on a node without an idle core the writer takes what the training leaves."""

    def __init__(self, jobs: list[tuple[str, object]], foreground_files: list[str], tag_dir: Path,
                 background: bool, max_bytes_per_s: float | None = None):
        self.foreground_files, self.tag_dir, self.max_bytes_per_s = foreground_files, tag_dir, max_bytes_per_s
        self.error: BaseException | None = None
        self.bytes = 0
        self.seconds = 0.0
        self._pid = None
        self._started = time.perf_counter()
        if not background:
            self._finish(self._write(jobs))
            return
        read_end, write_end = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the writer
            code = 1
            try:
                os.close(read_end)
                _die_with_parent(parent)
                os.nice(19)  # where cores are short, the training steps go first; the write waits
                report = self._write(jobs)
                os.write(write_end, json.dumps(report).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        jobs.clear()  # the child has them; the parent's references go
        self._pid, self._pipe = pid, read_end

    def _write(self, jobs: list[tuple[str, object]]) -> dict:
        """Write everything; a report {"bytes": n} or {"error": ..., "errno": ...} (also sent by the child)."""
        written = 0
        try:
            while jobs:
                path, state = jobs.pop(0)  # drop each copy once written: host memory goes back file by file
                written += write_durably(state, path, max_bytes_per_s=self.max_bytes_per_s)
                del state
            for p in self.foreground_files:  # written by DeepSpeed or by us in the foreground
                try:
                    with open(p, "rb") as f:
                        os.fsync(f.fileno())
                except FileNotFoundError:
                    pass  # another rank's file of a re-saved tag, being rewritten (and fsynced) by that rank
            for d in sorted({str(p.parent) for p in self.tag_dir.rglob("*") if p.is_file()} | {str(self.tag_dir)}):
                fsync_dir(d)  # the new names are durable too
            return {"bytes": written}
        except Exception as e:  # noqa: BLE001 - reported to every rank by the next agreement
            return {"error": f"{type(e).__name__}: {e}", "errno": getattr(e, "errno", None)}

    def _finish(self, report: dict) -> None:
        self.seconds = time.perf_counter() - self._started
        self.bytes = report.get("bytes", 0)
        if "error" in report:
            e = report["errno"]
            self.error = OSError(e, report["error"]) if e else RuntimeError(report["error"])

    def done(self) -> bool:
        if self._pid is None:
            return True
        pid, status = os.waitpid(self._pid, os.WNOHANG)
        if pid == 0:
            return False
        self._reap(status)
        return True

    def wait(self) -> None:
        if self._pid is not None:
            _, status = os.waitpid(self._pid, 0)
            self._reap(status)

    def _reap(self, status: int) -> None:
        with os.fdopen(self._pipe, "rb") as f:
            raw = f.read()
        self._pid = None
        code = os.waitstatus_to_exitcode(status)
        if code == 0 and raw:
            self._finish(json.loads(raw))
        else:
            self._finish({"error": f"checkpoint writer process ended with exit code {code}", "errno": None})


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when its parent dies (a killed rank must not leave its writer running)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)

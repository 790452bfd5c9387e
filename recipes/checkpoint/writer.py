"""How checkpoint files reach the disk: DeepSpeed hands every file of a save to `FileEngine` (its checkpoint-engine
interface), which either writes it now (sync) or copies it into shared memory for this rank's writer process (async,
recipes.checkpoint.shm_writer). Either way
every file is fsynced before the save counts as written, so `complete.json` (recipes.checkpoint.store) only ever
vouches for files that are on the disk.

Why not DeepSpeed's own DecoupledCheckpointEngine (0.19.8): its pipeline engine never commits a decoupled save
(`PipelineEngine` calls `_take_model_step` directly, the commit lives in `DeepSpeedEngine.step`), it needs the
libaio fast writer (not buildable here: `AsyncIOBuilder().is_compatible()` is False), it does not fsync, and it hands
the live tensors to its writer process through shared memory instead of copying them. torch.distributed.checkpoint's
async_save writes DCP files, not DeepSpeed's, which export, reshape and resume read.

Why a copy: the next optimizer step changes the parameters and moments in place; the writer process writes the
copy, so the files are exactly the state of the save step (byte-identical to a sync save: the copy keeps the
storage sharing of the original, so torch.save writes the same records; tested).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from data_prep.io import fsync_dir, fsync_file, open_write
from recipes.checkpoint import safe_load
from recipes.checkpoint.format import checksums

log = logging.getLogger(__name__)


class _Throttled:
    """A file whose writes average at most `bytes_per_s` (sleeps after each write until the average is met), until
    `full_speed()` says the training waits for this write (then it goes as fast as the disk does)."""

    def __init__(self, f, bytes_per_s: float, full_speed=None):
        self.f, self.rate, self.sent, self.t0 = f, bytes_per_s, 0, time.monotonic()
        self.full_speed = full_speed or (lambda: False)

    def write(self, data) -> int:
        n = self.f.write(data)
        self.sent += n
        # in short naps: torch.save writes a tensor as one record, whose sleep may be long, and a wait for this
        # write (a stop, the end, the next save) must not sit it out
        while not self.full_speed():
            ahead = self.sent / self.rate - (time.monotonic() - self.t0)
            if ahead <= 0:
                break
            time.sleep(min(ahead, 0.05))
        return n

    def __getattr__(self, name):  # flush, seek, tell, fileno: the file's own
        return getattr(self.f, name)


def write_durably(obj, path: str | Path, zipfile: bool = True, max_bytes_per_s: float | None = None,
                  full_speed=None, digests: dict[str, str] | None = None) -> int:
    """torch.save `obj` to `path` and fsync it (at most `max_bytes_per_s` when given, until `full_speed()` is true);
    returns its size in bytes. The bytes are hashed on their way out: `digests[path]` gets the file's checksum
    (recipes.checkpoint.format.checksums), for the writer's record."""
    with open_write(str(path)) as f:
        hashing = checksums.Hashing(f)
        torch.save(obj, _Throttled(hashing, max_bytes_per_s, full_speed) if max_bytes_per_s else hashing,
                   _use_new_zipfile_serialization=zipfile)
        fsync_file(f)
        if digests is not None:
            digests[str(path)] = hashing.hexdigest()
        return f.tell()


class FileEngine(CheckpointEngine):
    """DeepSpeed's checkpoint-engine interface (`engine.checkpoint_engine`): DeepSpeed calls `save(state, path)` for
    every file of `save_checkpoint` on every rank. Between `collect()` and `take()` the files are host-copied and kept
    for a background writer; otherwise written and fsynced at once."""

    def __init__(self, zipfile: bool = True):
        super().__init__()
        self.name = "recipes.FileEngine"
        self.zipfile = zipfile
        self._pending: list[tuple[str, bytes]] | None = None
        self._arena = None
        self.written: list[str] = []  # files written (sync) since the last take()
        self.digests: dict[str, str] = {}  # their checksums

    def collect(self, arena) -> None:
        """Until take(): pack every file into `arena` (a shm_writer.Arena whose previous save is written)."""
        arena.reset()
        self._pending, self._arena = [], arena

    def take(self) -> tuple[list[tuple[str, bytes]] | None, list[str]]:
        """(files packed since collect(), or None when sync; paths written in the foreground). Their checksums:
        `take_digests()`."""
        pending, written = self._pending, self.written
        self._pending, self._arena, self.written = None, None, []
        return pending, written

    def take_digests(self) -> dict[str, str]:
        """The checksums of the files written in the foreground since the last call (path -> digest)."""
        digests, self.digests = self.digests, {}
        return digests

    def save(self, state_dict, path: str) -> None:
        if self._pending is not None:
            self._pending.append((str(path), self._arena.pack(state_dict)))
        else:
            write_durably(state_dict, path, self.zipfile, digests=self.digests)
            self.written.append(str(path))

    def create(self, info) -> None:
        pass

    def load(self, path: str, map_location=None):
        return safe_load.load(path, map_location=map_location)

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
    """The rest of one rank's save after DeepSpeed's `save_checkpoint` returned: write the packed files (if any),
    fsync the files written in the foreground, fsync the directories; `error` is set if that failed.

    `background=None`: now, in this process. Otherwise `background` (a `shm_writer.BackgroundWriter`, whose arena
    holds the packed files) does it while training goes on; `done()` / `wait()` collect its report. `digests`: the
    checksums of the rank's foreground files; with those of the packed files they make the rank's checksum record."""

    def __init__(self, jobs: list[tuple[str, object]], foreground_files: list[str], tag_dir: Path,
                 background=None, max_bytes_per_s: float | None = None, digests: dict[str, str] | None = None):
        self.error: BaseException | None = None
        self.bytes = 0
        self.seconds = 0.0
        self._writer = background
        self._started = time.perf_counter()
        who = checksums.who_am_i()
        if background is None:
            self._finish(write_tag(((p, lambda s=s: s) for p, s in jobs), foreground_files, tag_dir,
                                   max_bytes_per_s, digests=digests, who=who))
        else:
            background.submit(jobs, foreground_files, str(tag_dir), max_bytes_per_s, digests=digests, who=who)

    def _finish(self, report: dict) -> None:
        self.seconds = time.perf_counter() - self._started
        self.bytes = report.get("bytes", 0)
        if "error" in report:
            e = report["errno"]
            self.error = OSError(e, report["error"]) if e else RuntimeError(report["error"])
        self._writer = None

    def done(self) -> bool:
        if self._writer is None:
            return True
        report = self._writer.result(wait=False)
        if report is None:
            return False
        self._finish(report)
        return True

    def wait(self) -> None:
        if self._writer is not None:
            self._finish(self._writer.result(wait=True))


def write_tag(jobs, foreground_files: list[str], tag_dir: str | Path, max_bytes_per_s: float | None,
              full_speed=None, digests: dict[str, str] | None = None, who: str | None = None) -> dict:
    """Write `jobs` ((path, a function returning the state to save)), fsync the `foreground_files` and every directory
    of the tag (throttled to `max_bytes_per_s` until `full_speed()`), record the checksums (`digests` of the
    foreground files and those of `jobs`) as `who`'s. A report {"bytes": n} or {"error": ..., "errno": ...} (the
    writer process sends it to its rank)."""
    written = 0
    digests = dict(digests or {})
    try:
        for path, state in jobs:
            written += write_durably(state(), path, max_bytes_per_s=max_bytes_per_s, full_speed=full_speed,
                                     digests=digests)
        checksums.record(tag_dir, who or checksums.who_am_i(), digests)
        for p in foreground_files:  # written by DeepSpeed or by us in the foreground
            try:
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            except FileNotFoundError:
                pass  # another rank's file of a re-saved tag, being rewritten (and fsynced) by that rank
        tag_dir = Path(tag_dir)
        for d in sorted({str(p.parent) for p in tag_dir.rglob("*") if p.is_file()} | {str(tag_dir)}):
            fsync_dir(d)  # the new names are durable too
        return {"bytes": written}
    except Exception as e:  # noqa: BLE001 - reported to every rank by the next agreement
        return {"error": f"{type(e).__name__}: {e}", "errno": getattr(e, "errno", None)}


def die_with_parent(parent: int) -> None:
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

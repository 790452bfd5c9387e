"""Save / auto-resume DeepSpeed checkpoints so that a resumed run continues bit for bit.

The files are DeepSpeed's own plus two small files of ours per tag (each rank's RNG states and complete.json, written
by rank 0 only after every rank's files are durable, sync or async: see Checkpointer); their layout is
recipes.checkpoint.format. On resume the newest tag whose complete.json exists and whose listed files are all
present with the recorded sizes is loaded; an interrupted or damaged save is skipped with a message saying so.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

import torch

from recipes.checkpoint import shm_writer, writer
from recipes.config import file_mode
from recipes.checkpoint.format import checksums, rng
from recipes.checkpoint.format.tags import MARKER, client_state as marked_client_state, mark_complete, newest_complete
from recipes.checkpoint.format.tags import step_of, tag_for

log = logging.getLogger(__name__)

__all__ = ["Checkpointer", "save", "load", "newest_agreed", "newest_complete", "mark_complete", "tag_for", "MARKER"]


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _barrier():
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


class Checkpointer:
    """The saves of one run (collective: every rank makes the same calls in the same order).

    sync (`background=False`): `save` returns once every rank's files are fsynced and complete.json is written.
    async: `save` returns once this rank's state is copied to host shared memory; the rank's writer process
    (recipes.checkpoint.shm_writer, started here) writes and fsyncs the files while training goes on. The ranks
    agree that the save is durable at a later step boundary (`poll`, one
    small all-reduce per step while a save is in flight: no rank waits for another's disk) or, at the latest, when
    the next save, a stop or the end of training calls `finish` (which waits). Only then does rank 0 write
    complete.json, `latest` and prune to keep_last: a crash before that leaves the previous complete checkpoint the
    newest one. At most one save is in flight (host memory for one copy of this rank's checkpoint files).
    """

    def __init__(self, engine, ckpt_dir: str, keep_last: int, background: bool, device=None,
                 max_mib_per_s: float | None = None, writer_cpus: set[int] | None = None, record: dict | None = None):
        self.engine, self.root, self.keep_last, self.background = engine, Path(ckpt_dir), keep_last, background
        self.record = record  # the layout / model / recipe entries of every complete.json (format.layout_record)
        self.max_bytes_per_s = max_mib_per_s * 2**20 if max_mib_per_s else None
        self.device = device if device is not None else torch.device("cpu")
        self.files = writer.install(engine)
        # async: the rank's writer process, started now so that it is ready (torch imported) by the first save
        self.background_writer = shm_writer.BackgroundWriter(writer_cpus) if background else None
        self.inflight: dict | None = None  # step, tag, client_state, write, started
        self.completed: int | None = None  # step of the newest save this run made complete

    def save(self, step: int, client_state: dict, capped: bool = True) -> str:
        """Start (async) or make (sync) the checkpoint of `step`. Returns the tag. `capped=False`: written without
        checkpoint.async_max_mib_per_s (a stop or the end waits for this save)."""
        self.finish()  # at most one in flight
        tag = tag_for(step)
        if _rank() == 0:
            # Re-saving a tag (e.g. after resuming from an older one): its old marker must not vouch for files that
            # are being rewritten, should this save be interrupted.
            (self.root / tag / MARKER).unlink(missing_ok=True)
            # ...nor its old checksum records (a rank of another layout may now write a file another rank wrote)
            for record in (self.root / tag).glob(f"{checksums.PREFIX}*{checksums.SUFFIX}"):
                record.unlink(missing_ok=True)
        _barrier()
        started = time.perf_counter()
        if self.background:
            self.files.collect(self.background_writer.arena)
        # `latest` is ours to write, after the marker: it never names a partial save.
        try:
            self.engine.save_checkpoint(str(self.root), tag=tag, client_state=client_state, save_latest=False)
            self.files.save(rng.rng_state(), str(rng.rng_file(self.root / tag, _rank())))
            jobs, written = self.files.take()
            digests = self.files.take_digests()
        except (OSError, RuntimeError) as e:
            self.files.take()
            self.files.take_digests()
            full = _disk_full_message(self.root, tag, e)
            if full:
                raise RuntimeError(full) from e
            raise
        foreground = written
        if _rank() == 0:  # files DeepSpeed writes itself (zero_to_fp32.py), not through the checkpoint engine
            queued = {p for p, _ in jobs or []}
            foreground = sorted({str(p) for p in (self.root / tag).rglob("*") if p.is_file()} - queued
                                - {str(self.root / tag / MARKER)})
        write = writer.TagWrite(jobs or [], foreground, self.root / tag, background=self.background_writer,
                                max_bytes_per_s=self.max_bytes_per_s if capped else None, digests=digests)
        self.inflight = {"step": step, "tag": tag, "client_state": client_state, "write": write, "started": started}
        if self.background:
            log.info(f"checkpoint: {tag} copied to host memory in {time.perf_counter() - started:.2f} s; "
                     "writing in the background")
        else:
            self.finish()
        return tag

    def poll(self) -> int | None:
        """Collective, at a step boundary: if every rank's in-flight save is durable, complete it. Never waits for a
        disk. Returns the step completed now, or None."""
        if self.inflight is None:
            return None
        return self._agree(wait=False)

    def finish(self) -> int | None:
        """Collective: wait for this rank's in-flight save, agree with the others, complete it. Returns its step."""
        if self.inflight is None:
            return None
        return self._agree(wait=True)

    def close(self) -> None:
        """Collective: complete the save in flight, then stop this rank's writer process and free its arena."""
        try:
            self.finish()
        finally:
            if self.background_writer is not None:
                self.background_writer.close()
                self.background_writer = None

    def abandon(self) -> None:
        """Not collective, for an error path: stop this rank's writer process now (its write, if any, is left without
        complete.json, never loaded, and removed by a later save's prune) and free its arena."""
        self.inflight = None
        if self.background_writer is not None:
            self.background_writer.close(wait=False)
            self.background_writer = None

    def _agree(self, wait: bool) -> int | None:
        write = self.inflight["write"]
        if wait:
            write.wait()
        flags = torch.tensor([0.0 if write.done() else 1.0, 1.0 if write.error else 0.0], device=self.device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        pending, failed = bool(flags[0].item()), bool(flags[1].item())
        tag = self.inflight["tag"]
        if failed:
            self.inflight = None
            if write.error is not None:
                full = _disk_full_message(self.root, tag, write.error)
                raise RuntimeError(full or f"checkpoint: writing {self.root / tag} failed: "
                                   f"{type(write.error).__name__}: {write.error}") from write.error
            # the failing rank's own message may be lost if it is stopped first: a full disk is said here too
            full = _disk_full_message(self.root, tag, None)
            raise RuntimeError(full or f"checkpoint: another rank failed to write {self.root / tag} (see its error); "
                               f"the partial {tag} has no {MARKER} and is never loaded")
        if pending:
            return None
        step, client_state = self.inflight["step"], self.inflight["client_state"]
        elapsed = time.perf_counter() - self.inflight["started"]
        self.inflight = None
        if _rank() == 0:
            self._mark_complete(tag, step, client_state, elapsed, write.bytes)
        if not self.background:
            _barrier()  # sync: every rank returns from save() with the marker written
        self.completed = step
        return step

    def _mark_complete(self, tag: str, step: int, client_state: dict, elapsed: float, own_bytes: int) -> None:
        # checkpoint.file_mode on every rank's files, DeepSpeed's own included (it copies zero_to_fp32.py with its
        # source's mode), before complete.json vouches for the tag
        file_mode.fix_tree(self.root / tag)
        file_mode.fix_dir_files(self.root)  # zero_to_fp32.py and zero_to_torch.py beside the tags
        files = mark_complete(self.root, tag, step, client_state, self.keep_last, self.record)
        log.info(f"checkpoint: {'async' if self.background else 'sync'} save of {tag}: "
                 f"{sum(files.values()) / 2**20:.1f} MiB, {elapsed:.1f} s from save to {MARKER}")


def save(engine, ckpt_dir: str, step: int, client_state: dict, keep_last: int, record: dict | None = None) -> str:
    """Collective: every rank calls it. A synchronous save (complete.json written when it returns); the tag."""
    return Checkpointer(engine, ckpt_dir, keep_last, background=False, record=record).save(step, client_state)


def _disk_full_message(root: Path, tag: str, e: BaseException | None) -> str | None:
    """A clear message when a save failed because checkpoint.dir's file system is full. torch.save reports a short
    write as "RuntimeError: [enforce fail at inline_container.cc] unexpected pos ...", not as ENOSPC: so the free
    space is looked at too. `e` None: another rank's write failed, with an error this rank does not have."""
    try:
        st = os.statvfs(root)
        free = st.f_bavail * st.f_frsize
    except OSError:
        return None
    if not (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) and free >= 64 << 20:
        return None
    good = newest_complete(str(root))
    error = "" if e is None else f"; {type(e).__name__}: {e}"
    return (f"checkpoint: saving {root / tag} failed: no space left on the file system of checkpoint.dir "
            f"({free >> 20} MiB free{error}). The partial {tag} has no {MARKER} and is never loaded. "
            f"Free space (or set checkpoint.dir elsewhere, or lower checkpoint.keep_last) and rerun: the run resumes "
            f"from {root / good if good else 'the start (no complete checkpoint yet)'}")


def newest_agreed(ckpt_dir: str | None) -> Path | None:
    """Collective: the newest complete tag of `ckpt_dir` as rank 0 finds it, the same on every rank (None: none)."""
    if not ckpt_dir:
        return None
    tag = _agreed_tag(ckpt_dir)
    return None if tag is None else Path(ckpt_dir) / tag


def load(engine, tag_dir: Path) -> dict:
    """Collective: DeepSpeed's own load of a tag saved at this engine's layout (every file read as data:
    recipes.torch_guard), then each rank's RNG states; returns the tag's client state."""
    tag_dir = Path(tag_dir)
    tag = tag_dir.name
    path, client_state = engine.load_checkpoint(str(tag_dir.parent), tag=tag, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
    if path is None:
        raise RuntimeError(f"checkpoint: DeepSpeed could not load {tag_dir}; move it aside to start over")
    if client_state is None or "consumed_samples" not in client_state:
        # The model-states file carrying client_state lives on DP rank 0 of each model-parallel rank.
        client_state = marked_client_state(tag_dir)
    rng.restore(tag_dir, _rank())
    return client_state


def _agreed_tag(ckpt_dir: str) -> str | None:
    """Rank 0 picks the newest complete tag and every rank loads that one."""
    def newest() -> int:
        tag = newest_complete(ckpt_dir)
        return -1 if tag is None else step_of(tag)

    step = agreed_step(newest)
    return None if step < 0 else tag_for(step)


def agreed_step(pick) -> int:
    """Collective: `pick()` on rank 0 (a tag's step, or a negative number for none), the same int on every rank. It
    travels as one int64, a fixed-shape tensor broadcast (no pickled object crosses the network)."""
    step = pick() if _rank() == 0 else -1
    if torch.distributed.is_initialized():
        nccl = torch.distributed.get_backend() == "nccl"  # NCCL moves CUDA tensors only
        t = torch.tensor([step], dtype=torch.int64, device=f"cuda:{torch.cuda.current_device()}" if nccl else "cpu")
        torch.distributed.broadcast(t, src=0)
        step = int(t.item())
    return step

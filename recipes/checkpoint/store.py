"""Save / auto-resume DeepSpeed checkpoints so that a resumed run continues bit for bit.

Layout on disk (DeepSpeed's own, plus two small files of ours per tag):
  <dir>/global_step<N>/...             DeepSpeed model / optimizer / scheduler / loss-scale states
  <dir>/global_step<N>/rng_rank<R>.pt  each rank's RNG states
  <dir>/global_step<N>/complete.json   written by rank 0 only after every rank's files are fsynced (sync or
                                       async save, see Checkpointer): step, consumed samples, files and sizes
  <dir>/latest                         DeepSpeed's pointer (users' habit), written by us after complete.json; resume
                                       still checks markers itself (a damaged newest tag is skipped)

On resume the newest tag whose complete.json exists and whose listed files are all present with the recorded sizes
is loaded; an interrupted or damaged save is skipped with a message saying so.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from data_prep.io import atomic_write
from recipes.checkpoint import safe_load, shm_writer, writer

log = logging.getLogger(__name__)
MARKER = "complete.json"
_TAG = re.compile(r"^global_step(\d+)$")


def tag_for(step: int) -> str:
    return f"global_step{step}"


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _barrier():
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _rng_state() -> dict:
    # Tensors and plain numbers only, so that resume reads the file with weights_only=True (recipes/safe_load.py).
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(),  # (version, tuple of ints, float | None)
             "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    if isinstance(n, dict):
        np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    else:  # a tuple with an ndarray: written before RNG states were tensors
        np.random.set_state(n)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


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
                 max_mib_per_s: float | None = None, writer_cpus: set[int] | None = None):
        self.engine, self.root, self.keep_last, self.background = engine, Path(ckpt_dir), keep_last, background
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
        _barrier()
        started = time.perf_counter()
        if self.background:
            self.files.collect(self.background_writer.arena)
        # `latest` is ours to write, after the marker: it never names a partial save.
        try:
            self.engine.save_checkpoint(str(self.root), tag=tag, client_state=client_state, save_latest=False)
            self.files.save(_rng_state(), str(self.root / tag / f"rng_rank{_rank()}.pt"))
            jobs, written = self.files.take()
        except (OSError, RuntimeError) as e:
            self.files.take()
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
                                max_bytes_per_s=self.max_bytes_per_s if capped else None)
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
            raise RuntimeError(f"checkpoint: another rank failed to write {self.root / tag} (see its error); the "
                               f"partial {tag} has no {MARKER} and is never loaded")
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
        files = mark_complete(self.root, tag, step, client_state, self.keep_last)
        log.info(f"checkpoint: {'async' if self.background else 'sync'} save of {tag}: "
                 f"{sum(files.values()) / 2**20:.1f} MiB, {elapsed:.1f} s from save to {MARKER}")


def save(engine, ckpt_dir: str, step: int, client_state: dict, keep_last: int) -> str:
    """Collective: every rank calls it. A synchronous save (complete.json written when it returns); the tag."""
    return Checkpointer(engine, ckpt_dir, keep_last, background=False).save(step, client_state)


def mark_complete(root: Path, tag: str, step: int, client_state: dict, keep_last: int) -> dict:
    """After every file of `tag` is durable: complete.json (files and sizes), then `latest`, then prune old tags.
    Returns the files and their sizes."""
    files = {str(p.relative_to(root / tag)): p.stat().st_size
             for p in sorted((root / tag).rglob("*")) if p.is_file() and p.name != MARKER}
    marker = {"step": step, "client_state": client_state, "files": files}
    atomic_write(str(root / tag / MARKER), json.dumps(marker, indent=1))
    atomic_write(str(root / "latest"), tag)
    _prune(root, keep_last, step)
    log.info(f"checkpoint: saved {root / tag} ({len(files)} files)")
    return files


def _disk_full_message(root: Path, tag: str, e: BaseException) -> str | None:
    """A clear message when a save failed because checkpoint.dir's file system is full. torch.save reports a short
    write as "RuntimeError: [enforce fail at inline_container.cc] unexpected pos ...", not as ENOSPC: so the free
    space is looked at too."""
    try:
        st = os.statvfs(root)
        free = st.f_bavail * st.f_frsize
    except OSError:
        return None
    if not (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) and free >= 64 << 20:
        return None
    good = newest_complete(str(root))
    return (f"checkpoint: saving {root / tag} failed: no space left on the file system of checkpoint.dir "
            f"({free >> 20} MiB free; {type(e).__name__}: {e}). The partial {tag} has no {MARKER} and is never loaded. "
            f"Free space (or set checkpoint.dir elsewhere, or lower checkpoint.keep_last) and rerun: the run resumes "
            f"from {root / good if good else 'the start (no complete checkpoint yet)'}")


def _tags(root: Path) -> list[tuple[int, str]]:
    if not root.is_dir():
        return []
    out = [(int(m.group(1)), p.name) for p in root.iterdir() if p.is_dir() and (m := _TAG.match(p.name))]
    return sorted(out, reverse=True)


def _prune(root: Path, keep_last: int, completed_step: int) -> None:
    """Keep the newest `keep_last` complete tags, and remove the incomplete tags older than the one just completed
    (`completed_step`): interrupted saves, full-size and never loaded. At most one save is in flight and it is the one
    just completed, so an older incomplete tag is never being written; newer ones are left alone (a resume from an
    older tag re-saves them)."""
    tags = _tags(root)
    complete = [t for _, t in tags if (root / t / MARKER).is_file()]
    for t in complete[keep_last:]:
        shutil.rmtree(root / t, ignore_errors=True)
        log.info(f"checkpoint: removed old {root / t} (keep_last={keep_last})")
    for s, t in tags:
        if s < completed_step and not (root / t / MARKER).is_file():
            shutil.rmtree(root / t, ignore_errors=True)
            log.info(f"checkpoint: removed {root / t}, an interrupted save older than {tag_for(completed_step)}")


def problems(tag_dir: Path) -> list[str]:
    """Why a tag cannot be loaded ([] if it is complete)."""
    marker = tag_dir / MARKER
    if not marker.is_file():
        return [f"no {MARKER} (the save was interrupted)"]
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError) as e:
        return [f"unreadable {MARKER}: {e}"]
    out = []
    for name, size in files.items():
        p = tag_dir / name
        if not p.is_file():
            out.append(f"missing {name}")
        elif p.stat().st_size != size:
            out.append(f"{name} has {p.stat().st_size} bytes, expected {size}")
    return out


def newest_complete(ckpt_dir: str) -> str | None:
    """The newest loadable tag, saying which newer ones were skipped and why."""
    root = Path(ckpt_dir)
    for _, tag in _tags(root):
        bad = problems(root / tag)
        if not bad:
            return tag
        log.warning(f"checkpoint: skipping {root / tag}: {'; '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}; "
                    "falling back to an older checkpoint")
    return None


def resume(engine, ckpt_dir: str | None) -> dict | None:
    """Collective. Load the newest complete checkpoint; returns its client_state, or None when starting fresh."""
    if not ckpt_dir:
        return None
    choice = [newest_complete(ckpt_dir) if _rank() == 0 else None]
    if torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(choice, src=0)  # every rank loads the same tag
    tag = choice[0]
    if tag is None:
        return None
    safe_load.guard_engine(engine)  # DeepSpeed's own reads of model/optimizer files: data only
    path, client_state = engine.load_checkpoint(ckpt_dir, tag=tag, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
    if path is None:
        raise RuntimeError(f"checkpoint: DeepSpeed could not load {Path(ckpt_dir) / tag}; move it aside to start over")
    if client_state is None or "consumed_samples" not in client_state:
        # The model-states file carrying client_state lives on DP rank 0 of each model-parallel rank.
        client_state = json.loads((Path(ckpt_dir) / tag / MARKER).read_text())["client_state"]
    rng = Path(ckpt_dir) / tag / f"rng_rank{_rank()}.pt"
    if rng.is_file():
        _set_rng_state(safe_load.load(rng, legacy_rng=True))
    log.info(f"checkpoint: resumed from {Path(ckpt_dir) / tag} at step {client_state['step']}, "
        f"{client_state['consumed_samples']} samples consumed")
    return client_state

"""tokenize: inputs -> work units -> one shard per unit (each written by the worker that tokenized it) -> manifest.

Resume: a unit whose stats file matches its input key and the settings fingerprint, with shard files of the recorded
sizes and a valid header, is skipped. Everything else is redone from scratch, writing to temporary names first, so a
run killed at any moment and rerun gives the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import numpy as np
import orjson

from . import manifest as mf
from .fast_path import FastEncoder, FastPathMismatch
from .readers import TOO_LONG, InputError, position_kind, read_piece
from .shards import ShardWriter, expected_idx_bytes, read_header, tmp_paths
from .tokenizers import load_tokenizer, optimal_dtype
from .units import Unit, list_inputs, plan_units

INT32_MAX = 2**31 - 1


@dataclass
class Settings:
    inputs: List[str]
    output_dir: str
    tokenizer: str
    text_field: str = "text"
    workers: int = 1
    shard_size: int = 256 << 20  # input bytes per work unit (and so per shard)
    append_eod: bool = True
    add_bos: bool = False
    eod_id: Optional[int] = None
    max_doc_tokens: int = INT32_MAX
    long_docs: str = "split"  # split | reject
    fast_path: bool = True
    verify_fraction: float = 0.0
    batch_docs: int = 256
    slice_index: int = 0  # this node runs units with index % slice_count == slice_index
    slice_count: int = 1
    merge_only: bool = False  # do no unit work: write the manifest if all units are complete, else list them
    executor: str = "local"  # local (process pool) | ray (tasks on a Ray cluster)
    ray_address: Optional[str] = None  # None: start a local Ray instance; "auto" or ray://host:port: join one
    batch_chars: int = 1 << 20  # a batch also ends at this much text: memory stays flat whatever the documents
    quiet: bool = False

    def output_affecting(self, tok_sha: str) -> dict:
        """The settings that change the bytes written (not workers, fast path, batch size or verbosity)."""
        return {
            "tokenizer_sha256": tok_sha,
            "text_field": self.text_field,
            "shard_size": self.shard_size,
            "append_eod": self.append_eod,
            "add_bos": self.add_bos,
            "eod_id": self.eod_id,
            "max_doc_tokens": self.max_doc_tokens,
            "long_docs": self.long_docs,
        }


class RunFailed(Exception):
    def __init__(self, message: str, failed: List[dict]):
        super().__init__(message)
        self.failed = failed


def fingerprint(d: dict) -> str:
    return hashlib.sha256(orjson.dumps(d, option=orjson.OPT_SORT_KEYS)).hexdigest()


# --- worker side -------------------------------------------------------------------------------------------------

_STATE: dict = {}


def _init_worker(progress_q) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _STATE["progress"] = progress_q


def _encoder(settings: Settings, sample: List[str]) -> FastEncoder:
    key = (settings.tokenizer, settings.eod_id, settings.fast_path)
    if _STATE.get("enc_key") != key or not _STATE.get("enc_checked"):
        # A forked worker inherits the driver's encoder (not yet self-checked): no second load per worker.
        enc = _STATE.get("enc") if _STATE.get("enc_key") == key else None
        if enc is None:
            enc = FastEncoder(load_tokenizer(settings.tokenizer, settings.eod_id), enabled=settings.fast_path)
        # self-check on the first documents, up to ~256k characters (it encodes them twice)
        check, chars = [], 0
        for t in sample[:64]:
            if check and chars + len(t) > 256_000:
                break
            check.append(t)
            chars += len(t)
        enc.self_check(check)
        _STATE.update(enc_key=key, enc=enc, enc_checked=True)
    return _STATE["enc"]


class _UnitRun:
    def __init__(self, unit: Unit, settings: Settings, fp: str):
        self.unit, self.s, self.fp = unit, settings, fp
        self.prefix = os.path.join(settings.output_dir, unit.name)
        self.rejected: Counter = Counter()
        self.records = 0
        self.seen_docs = 0
        self.reject_tmp = mf.rejects_path(settings.output_dir, unit.name) + ".tmp"
        self.reject_f = None
        self.writer: Optional[ShardWriter] = None
        self.enc: Optional[FastEncoder] = None
        self.last_report = time.monotonic()
        self.pending = [0, 0, 0]  # docs, tokens, chars since the last progress report

    def reject(self, piece, pos, reason):
        self.rejected[reason] += 1
        if self.reject_f is None:
            self.reject_f = open(self.reject_tmp, "wb")
        self.reject_f.write(orjson.dumps({"file": piece.path, position_kind(piece): pos, "reason": reason}) + b"\n")

    def flush_batch(self, batch):
        if not batch:
            return
        texts = [t for _, _, t in batch]
        if self.enc is None:
            self.enc = _encoder(self.s, texts)
        ids_list = self.enc.encode_arrays(texts)
        s = self.s
        if s.verify_fraction > 0:
            self._verify(texts, ids_list)
        dtype = self.writer.dtype
        eod, bos = self.enc.tok.info.eod_id, self.enc.tok.info.bos_id
        head = np.array([bos] if s.add_bos and bos is not None else [], dtype=dtype)
        tail = np.array([eod] if s.append_eod else [], dtype=dtype)
        ntok = 0
        for (piece, pos, _), ids in zip(batch, ids_list):
            arr = np.concatenate([head, ids.astype(dtype, copy=False), tail])
            if len(arr) > s.max_doc_tokens:
                if s.long_docs == "reject":
                    self.reject(piece, pos, TOO_LONG)
                    continue
                seqs = [arr[i : i + s.max_doc_tokens] for i in range(0, len(arr), s.max_doc_tokens)]
            else:
                seqs = [arr]
            self.writer.add_document(seqs)
            ntok += len(arr)
        self._progress(len(batch), ntok, sum(len(t) for t in texts))

    def _verify(self, texts, ids_list):
        f = self.s.verify_fraction
        picks = []
        for i in range(len(texts)):
            n = self.seen_docs + i
            if int((n + 1) * f) > int(n * f):
                picks.append(i)
        self.seen_docs += len(texts)
        if picks and self.enc.active:
            whole = self.enc.tok.encode_batch([texts[i] for i in picks])
            for i, want in zip(picks, whole):
                if list(want) != ids_list[i].tolist():
                    raise FastPathMismatch(
                        f"fast path differs from whole-document encoding in {self.unit.name} (document {i} of a "
                        "batch); rerun with --no-fast-path and report the tokenizer")

    def _progress(self, docs, toks, chars):
        p = self.pending
        p[0] += docs
        p[1] += toks
        p[2] += chars
        q = _STATE.get("progress")
        now = time.monotonic()
        if q is not None and now - self.last_report > 0.5:
            q.put((self.unit.index, *p))
            self.pending, self.last_report = [0, 0, 0], now

    def run(self) -> dict:
        s = self.s
        # The dtype needs the vocabulary size; the tokenizer is loaded lazily, so read it from a cheap first load.
        info = _STATE.get("info")
        if info is None or info.path != os.path.abspath(s.tokenizer):
            info = load_tokenizer(s.tokenizer, s.eod_id).info
            _STATE["info"] = info
        self.writer = ShardWriter(self.prefix, optimal_dtype(info.vocab_size))
        try:
            batch, chars = [], 0
            for piece in self.unit.pieces:
                for pos, text, reason in read_piece(piece, s.text_field):
                    self.records += 1
                    if text is None:
                        self.reject(piece, pos, reason)
                        continue
                    batch.append((piece, pos, text))
                    chars += len(text)
                    if len(batch) >= s.batch_docs or chars >= s.batch_chars:
                        self.flush_batch(batch)
                        batch, chars = [], 0
            self.flush_batch(batch)
        except BaseException:
            self.writer.abort()
            if self.reject_f:
                self.reject_f.close()
                os.remove(self.reject_tmp)
            raise
        q = _STATE.get("progress")
        if q is not None:
            q.put((self.unit.index, *self.pending))
        if self.writer.documents:
            shard = self.writer.finalize()
        else:  # megatron cannot mmap an empty .bin: a unit with no documents has stats but no shard
            self.writer.abort()
            shard = {"documents": 0, "sequences": 0, "tokens": 0, "bytes": 0, "idx_bytes": 0,
                     "sha256_bin": None, "sha256_idx": None}
            for suffix in (".bin", ".idx"):
                if os.path.exists(self.prefix + suffix):
                    os.remove(self.prefix + suffix)
        rpath = mf.rejects_path(s.output_dir, self.unit.name)
        if self.reject_f:
            self.reject_f.flush()
            os.fsync(self.reject_f.fileno())
            self.reject_f.close()
            os.replace(self.reject_tmp, rpath)
        elif os.path.exists(rpath):
            os.remove(rpath)
        stats = {
            "unit": self.unit.name,
            "key": self.unit.key(),
            "fingerprint": self.fp,
            "prefix": self.unit.name if shard["documents"] else None,
            **shard,
            "input_records": self.records,
            "inputs": [{"path": p.path, "kind": p.kind, "start": p.start, "end": p.end} for p in self.unit.pieces],
            "rejected": dict(sorted(self.rejected.items())),
        }
        if self.records != shard["documents"] + sum(self.rejected.values()):
            raise AssertionError(f"{self.unit.name}: records do not balance")
        mf.atomic_write(mf.stats_path(s.output_dir, self.unit.name), mf.dumps(stats))
        return stats


def process_unit(unit: Unit, settings: Settings, fp: str) -> dict:
    """Run one unit; an unreadable input is returned as a failure (not raised) so other units carry on."""
    err_path = mf.error_path(settings.output_dir, unit.name)
    try:
        stats = _UnitRun(unit, settings, fp).run()
    except InputError as e:
        res = {"ok": False, "unit": unit.name, "path": e.path, "error": e.why}
        mf.atomic_write(err_path, mf.dumps({k: res[k] for k in ("unit", "path", "error")}))
        return res
    if os.path.exists(err_path):
        os.remove(err_path)
    return {"ok": True, "stats": stats}


# --- driver side -------------------------------------------------------------------------------------------------


def unit_is_complete(out_dir: str, unit: Unit, fp: str) -> Optional[dict]:
    st = mf.load_stats(out_dir, unit.name)
    if not st or st.get("fingerprint") != fp or st.get("key") != unit.key():
        return None
    if st["documents"] == 0:
        return st
    prefix = os.path.join(out_dir, unit.name)
    try:
        if os.path.getsize(prefix + ".bin") != st["bytes"] or os.path.getsize(prefix + ".idx") != st["idx_bytes"]:
            return None
        head = read_header(prefix + ".idx")
    except (OSError, ValueError):
        return None
    if head["sequences"] != st["sequences"] or head["document_count"] != st["documents"] + 1:
        return None
    if st["idx_bytes"] != expected_idx_bytes(st["sequences"], st["documents"]):
        return None
    return st


def check_output_dir(out_dir: str) -> None:
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, ".write_probe")
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.remove(probe)
    except OSError as e:
        raise PermissionError(f"output directory {out_dir} is not writable ({e.strerror}); choose another --output") from e


def _log(settings: Settings, msg: str) -> None:
    if not settings.quiet:
        print(msg, file=sys.stderr, flush=True)


def run(settings: Settings) -> Optional[dict]:
    """Tokenize (this slice of) the units; returns the manifest once all units are complete, else None (a slice
    whose peers are still running). Raises RunFailed (after finishing the rest) if inputs failed."""
    settings.output_dir = os.path.abspath(settings.output_dir)
    settings.tokenizer = os.path.abspath(settings.tokenizer) if settings.tokenizer else settings.tokenizer
    if settings.long_docs not in ("split", "reject"):
        raise ValueError("--long-docs must be split or reject")
    if not 0 < settings.max_doc_tokens <= INT32_MAX:
        raise ValueError(f"--max-doc-tokens must be in 1..{INT32_MAX} (the format stores int32 lengths)")
    tok = load_tokenizer(settings.tokenizer, settings.eod_id)  # fail before any work if it is missing or broken
    info = tok.info
    dtype = np.dtype(optimal_dtype(info.vocab_size)).name
    check_output_dir(settings.output_dir)
    units = plan_units(list_inputs(settings.inputs), settings.shard_size)
    out_settings = settings.output_affecting(info.sha256)
    fp = fingerprint(out_settings)
    manifest_path = os.path.join(settings.output_dir, mf.MANIFEST)
    mf.remove_stale_tmp(settings.output_dir)
    mf.atomic_write(os.path.join(settings.output_dir, "plan.json"), shared=True, data=mf.dumps(
        {"fingerprint": fp, "settings": out_settings,
         "units": [{"name": u.name, "key": u.key(), "inputs": [p.as_dict() for p in u.pieces]} for u in units]}))

    mine = [u for u in units if u.index % settings.slice_count == settings.slice_index]
    done = {}
    todo = []
    for u in mine:
        st = unit_is_complete(settings.output_dir, u, fp)
        if st is not None:
            done[u.name] = st
        elif not settings.merge_only:
            todo.append(u)
    if todo and os.path.exists(manifest_path):
        os.remove(manifest_path)  # nothing may look complete while units are redone
    probe = FastEncoder(tok, enabled=settings.fast_path)
    # Workers forked from here (and the in-process path) start from this tokenizer and encoder; each worker still
    # self-checks the encoder on its own first documents.
    _STATE.update(info=info, enc_key=(settings.tokenizer, settings.eod_id, settings.fast_path), enc=probe,
                  enc_checked=False)
    where = f" (slice {settings.slice_index}/{settings.slice_count})" if settings.slice_count > 1 else ""
    _log(settings, f"data_prep: {len(units)} units{where}, {len(mine)} mine, {len(done)} already complete, "
                   f"{len(todo)} to do; {settings.workers} worker(s); fast path: "
                   f"{'on' if probe.active else 'off (' + str(probe.reason) + ')'}")
    failed = _execute(todo, settings, fp, done)
    if failed:
        lines = "\n".join(f"  {f['unit']}: {f['path']}: {f['error']}" for f in failed)
        if settings.slice_count == 1:
            mf.atomic_write(os.path.join(settings.output_dir, mf.FAILED), mf.dumps(failed), shared=True)
        raise RunFailed(f"{len(failed)} unit(s) failed; other units are complete; rerun the same command to retry "
                        f"them:\n{lines}", failed)
    return finish(settings.output_dir, units, fp, info, dtype, out_settings, done,
                  require_all=settings.merge_only or settings.slice_count == 1, quiet=settings.quiet)


def finish(out_dir, units, fp, info, dtype, out_settings, done, require_all=True, quiet=False) -> Optional[dict]:
    """Write manifest.json when every unit is complete (whichever slice or node gets here last does it).

    With ``require_all``, missing units raise RunFailed naming them and the error each recorded (if any)."""
    missing = []
    for u in units:
        if u.name not in done:
            st = unit_is_complete(out_dir, u, fp)
            if st is None:
                missing.append(u)
            else:
                done[u.name] = st
    failed_path = os.path.join(out_dir, mf.FAILED)
    if missing:
        if not require_all:
            if not quiet:
                print(f"data_prep: this slice is complete; {len(missing)} unit(s) of other slices are not yet; the "
                      "last slice to finish (or --merge-only) writes manifest.json", file=sys.stderr)
            return None
        failed = []
        for u in missing:
            err = mf.load_error(out_dir, u.name) or {}
            failed.append({"unit": u.name, "path": err.get("path", ", ".join(p.path for p in u.pieces)),
                           "error": err.get("error", "not run yet (or killed)")})
        mf.atomic_write(failed_path, mf.dumps(failed), shared=True)
        lines = "\n".join(f"  {f['unit']}: {f['path']}: {f['error']}" for f in failed[:50])
        raise RunFailed(f"{len(missing)} unit(s) are not complete; rerun tokenize (same arguments) to do them:\n"
                        f"{lines}", failed)
    if os.path.exists(failed_path):
        os.remove(failed_path)
    stats = [done[u.name] for u in units]
    manifest = mf.build_manifest(out_dir, stats, info.manifest_dict(), dtype, out_settings)
    mf.merge_reject_logs(out_dir, [u.name for u in units])
    mf.atomic_write(os.path.join(out_dir, mf.MANIFEST), mf.dumps(manifest), shared=True)
    return manifest


def _execute(todo: List[Unit], settings: Settings, fp: str, done: dict) -> List[dict]:
    from .progress import Progress

    failed = []
    with Progress({u.index: u.nbytes for u in todo}, quiet=settings.quiet) as bar:
        if settings.executor == "ray":
            _execute_ray(todo, settings, fp, done, failed, bar)
        elif settings.workers <= 1 or len(todo) <= 1:
            q = queue_mod.SimpleQueue()
            _init_worker(q)
            try:
                for u in todo:
                    res = process_unit(u, settings, fp)
                    bar.drain(q)
                    _collect(res, u, done, failed, bar)
            finally:
                _STATE.pop("progress", None)
        else:
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            with ProcessPoolExecutor(settings.workers, mp_context=ctx, initializer=_init_worker,
                                     initargs=(q,)) as pool:
                futures = {pool.submit(process_unit, u, settings, fp): u for u in todo}
                pending = set(futures)
                try:
                    while pending:
                        bar.drain(q, timeout=0.2)
                        finished = [f for f in pending if f.done()]
                        for f in finished:
                            pending.discard(f)
                            _collect(f.result(), futures[f], done, failed, bar)
                except BaseException:
                    # a bug, a fast-path mismatch, a full disk or Ctrl-C: stop now, do not start more units
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
            bar.drain(q)  # after shutdown: the workers have exited, so their last messages are in the pipe
    failed.sort(key=lambda f: f["unit"])
    return failed


def _execute_ray(todo: List[Unit], settings: Settings, fp: str, done: dict, failed: list, bar) -> None:
    """Each unit is one Ray task (1 CPU). The repo must be importable on every Ray node (shared file system)."""
    try:
        import ray
    except ImportError as e:
        raise RuntimeError("--executor ray needs the ray package (pip install ray, as pinned in requirements.txt)") \
            from e
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"PYTHONPATH": repo, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
    started = not ray.is_initialized()
    if started:
        kw = {"address": settings.ray_address} if settings.ray_address else {"num_cpus": max(1, settings.workers)}
        ray.init(runtime_env={"env_vars": env}, log_to_driver=False, include_dashboard=False,
                 configure_logging=False, **kw)
    try:
        task = ray.remote(num_cpus=1, max_retries=2)(process_unit)
        refs = {task.remote(u, settings, fp): u for u in todo}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for r in ready:
                _collect(ray.get(r), refs[r], done, failed, bar)
    finally:
        if started:
            ray.shutdown()


def _collect(res: dict, unit: Unit, done: dict, failed: list, bar) -> None:
    if res["ok"]:
        done[unit.name] = res["stats"]
        bar.unit_done(unit.index)
    else:
        failed.append({k: res[k] for k in ("unit", "path", "error")})
        bar.unit_done(unit.index)
        bar.write(f"FAILED {res['unit']}: {res['path']}: {res['error']}")

"""The curation tasks an executor runs: hash pass (per unit), bucket pass (per bucket), filter pass (per unit).

Files of the dedup passes live in ``<output>/dedup/`` (deterministic content: the same whatever the worker count or
engine); each task writes its data files atomically and then its marker (``hash_NNNNNN.json``, ``bucket_NNNNN.json``),
the completion marker a rerun checks, as the tokenize step does with ``shard_NNNNNN.stats.json``.

``DocGate`` is the filter pass's decision for one unit: the steps in order, a document removed by a step not seen by
the later ones. The jsonl output mode (``filter_unit``) and the tokenize step (steps/tokenize.py) both use it.
"""

from __future__ import annotations

import base64
import io as pyio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import orjson

from data_prep import io, progress
from data_prep.read.formats import InputError, position_kind, read_piece
from data_prep.read.units import Unit
from data_prep.settings import DEFAULT_MAX_RECORD
from data_prep.steps import dedup as dd
from data_prep.steps import doc_steps as ds
from data_prep.steps import span_dedup as sd
from data_prep.steps import verdicts as vd
from data_prep.steps.filters import QualityFilter
from data_prep.steps.step_list import StepList
from data_prep.write.rejects import RejectLog
from data_prep.write.removals import RemovalLog

log = logging.getLogger(__name__)

DEDUP_DIR = "dedup"
REASONS = {"quality": None, "exact_dedup": "duplicate", "minhash_dedup": "near_duplicate"}


def _kernel_quality(step) -> bool:
    """A quality step the compiled kernels evaluate (its verdicts are carried from the hash pass)."""
    return step.kind == "quality" and step.cfg.definitions == "ours"


def needs_records(steps: StepList) -> bool:
    return any(ds.is_doc_step(s) and s.kind == "url_filter" for s in steps.steps)


@dataclass
class CurateContext:
    """What every curation task needs (picklable: it travels to pool workers and Ray tasks)."""

    output_dir: str
    steps: StepList
    fp: str
    units: int  # number of work units in the plan
    text_field: str = "text"
    max_record_size: int = DEFAULT_MAX_RECORD
    extra: dict = field(default_factory=dict)

    @property
    def dedup_dir(self) -> str:
        return os.path.join(self.output_dir, DEDUP_DIR)


@dataclass(frozen=True)
class Bucket:
    """A bucket-pass task, shaped like a Unit for the executors (``index``, ``name``)."""

    index: int

    @property
    def name(self) -> str:
        return f"bucket_{self.index:05d}"

    @property
    def nbytes(self) -> int:
        return 1


def load_step_resources(steps: StepList) -> None:
    """Per-process costs paid once, before any document (and before a driver forks its workers, which inherit
    them): the compiled kernels of quality and MinHash steps, and a MinHasher built once (its band layout:
    datasketch's optimisation, scipy integrations; the xxhash import), so that no first document pays them."""
    if any(s.kind in ("quality", "minhash_dedup", "decontaminate") or s.is_span_dedup for s in steps.steps):
        from data_prep.steps import kernels

        kernels.warm_up()
    for s in steps.steps:
        if s.kind == "minhash_dedup":
            dd.MinHasher(s.cfg)
        elif ds.is_doc_step(s):
            ds.build(s)  # its model, lists or evaluation n-grams, loaded once (a bad file or task fails here)


def _path(ctx: CurateContext, *parts: str) -> str:
    return os.path.join(ctx.dedup_dir, ".".join(parts))


def hash_marker(ctx: CurateContext, unit_index: int) -> str:
    return _path(ctx, f"hash_{unit_index:06d}", "json")


def bucket_marker(ctx: CurateContext, b: int) -> str:
    return _path(ctx, f"bucket_{b:05d}", "json")


def cluster_marker(ctx: CurateContext) -> str:
    return _path(ctx, "cluster", "json")


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = pyio.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _save_npy(path: str, arr: np.ndarray) -> None:
    io.atomic_write(path, _npy_bytes(arr), shared=True)  # slices may race on the cluster file


def _save_npys(items) -> None:
    """Several arrays of one task: one directory fsync for all (the task's marker follows)."""
    io.atomic_write_many([(p, _npy_bytes(a)) for p, a in items], shared=True)


def _load_npy(path: str, mmap: bool = True) -> np.ndarray:
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


def marker_ok(path: str, fp: str) -> Optional[dict]:
    try:
        with io.open_read(path) as f:
            m = orjson.loads(f.read())
    except (OSError, ValueError):
        return None
    return m if m.get("fingerprint") == fp else None


def _records(unit: Unit, ctx: CurateContext):
    """(piece, position, ordinal, text, reject reason, record or None) of every record of the unit, in order; the
    whole input record only when a step reads another field (url_filter)."""
    if needs_records(ctx.steps):
        yield from _whole_records(unit, ctx)
        return
    ordinal = 0
    for piece in unit.pieces:
        for pos, text, reason in read_piece(piece, ctx.text_field, ctx.max_record_size):
            yield piece, pos, ordinal, text, reason, None
            ordinal += 1


def _whole_records(unit: Unit, ctx: CurateContext):
    """_records with the whole input record (a dict, every field) last: the filter pass writes kept documents back
    as records."""
    ordinal = 0
    for piece in unit.pieces:
        for pos, text, reason, record in read_piece(piece, ctx.text_field, ctx.max_record_size, whole=True):
            yield piece, pos, ordinal, text, reason, record
            ordinal += 1


def _json_default(value):
    """Parquet/dataset values JSON has no type for: bytes as base64 text, anything else as its str()."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def kept_record(record: dict, text_field: str, text: str, fields: Optional[dict]) -> bytes:
    """A kept document as one jsonl line: the input record, every field kept, its text field set to the (possibly
    rewritten) text and the steps' own fields (language, ...) added."""
    out = dict(record)
    out[text_field] = text
    if fields:
        out.update(fields)
    return orjson.dumps(out, default=_json_default) + b"\n"


class _Reporter:
    def __init__(self, index: int):
        self.index, self.last, self.pending = index, time.monotonic(), [0, 0, 0]

    def add(self, chars: int) -> None:
        self.pending[0] += 1
        self.pending[2] += chars
        now = time.monotonic()
        if progress.watched() and now - self.last > 0.5:
            progress.report(self.index, *self.pending)
            self.pending, self.last = [0, 0, 0], now

    def flush(self) -> None:
        progress.report(self.index, *self.pending)


def _failure(unit, e: Exception) -> dict:
    path, why = (e.path, e.why) if isinstance(e, InputError) else (
        ", ".join(p.path for p in unit.pieces), "out of memory in this unit (lower --workers or --shard-size)")
    return {"ok": False, "unit": unit.name, "path": path, "error": why}


# --- pass 1: hashes -----------------------------------------------------------------------------------------------


class _UnitHashes:
    """What the hash pass gathers over one unit: each dedup step's keys (MinHash: and signatures), and the verdict
    of each quality step before the last dedup step per record ordinal (carried to the filter pass: verdicts.py)."""

    def __init__(self, steps):
        self.steps = steps
        self.last = max(i for i, s in enumerate(steps) if s.is_dedup)
        self.filters = {i: QualityFilter(s.cfg) for i, s in enumerate(steps[:self.last]) if _kernel_quality(s)}
        self.doc_steps = {i: ds.build(s) for i, s in enumerate(steps[:self.last]) if ds.is_doc_step(s)}
        self.hashers = {i: (dd.ExactHasher(s.cfg) if s.kind == "exact_dedup" else dd.MinHasher(s.cfg))
                        for i, s in enumerate(steps) if s.kind in ("exact_dedup", "minhash_dedup")}
        self.spans = {i: sd.units_of(s) for i, s in enumerate(steps) if s.is_span_dedup}
        self.span_keys: Dict[int, list] = {i: [] for i in self.spans}
        self.keys: Dict[int, list] = {i: [] for i in self.hashers}
        self.sigs: Dict[int, list] = {i: [] for i in self.hashers if steps[i].kind == "minhash_dedup"}
        self.sig_refs: Dict[int, list] = {i: [] for i in self.sigs}
        self.verdicts: Dict[int, bytearray] = {i: bytearray() for i in self.filters}
        # the per-document steps' outcome per record ordinal (carried to the filter pass): 0 = none removed it,
        # k = the (step, reason) self.reasons[k - 1] did
        self.doc_codes: List[int] = []
        self.reasons: Dict[Tuple[str, str], int] = {}

    def reject(self) -> None:
        for v in self.verdicts.values():
            v.append(vd.NOT_EVALUATED)
        if self.doc_steps:
            self.doc_codes.append(0)

    def add(self, ref: int, text: str, record: Optional[dict] = None) -> None:
        # Dedup steps ignore what earlier dedup steps removed: exact copies share every MinHash band, and the
        # smallest ref of a group is never a copy removed earlier, so the keepers are those of running them in turn
        reached, words = True, None  # words: the text's word spans from a quality step, reused by MinHash
        doc = ds.Doc(text, record) if self.doc_steps else None
        code = 0
        for i in range(self.last + 1):
            if i in self.filters:
                if reached:
                    why, words = self.filters[i].evaluate(text)
                self.verdicts[i].append(vd.code(why) if reached else vd.NOT_EVALUATED)
                reached = reached and why is None
            elif i in self.doc_steps:
                if reached:  # the filter pass reuses a removal; the steps that rewrite or add fields run again there
                    why = self.doc_steps[i].apply(doc)
                    if why is not None:
                        code = self.reasons.setdefault((self.steps[i].name, why), len(self.reasons) + 1)
                    reached = why is None
                    if doc.text is not text:
                        text, words = doc.text, None
            elif reached and i in self.spans:
                entries = sd.window_entries(self.spans[i], text, ref)
                if entries is not None:
                    self.span_keys[i].append(entries)
            elif reached and i in self.sigs:
                h = self.hashers[i]
                sig = h.signature(text, words)
                self.sigs[i].append(sig)
                self.sig_refs[i].append(ref)
                self.keys[i] += [(a, b, ref) for a, b in h.band_keys(sig)]
            elif reached:
                self.keys[i] += [(a, b, ref) for a, b in self.hashers[i].keys(text)]
        if self.doc_steps:
            self.doc_codes.append(code)

    def files(self, ctx: "CurateContext", unit: int, buckets: int):
        """([(path, array)], documents per dedup step, {quality step: its verdict file's marker entry})."""
        files, counts, entries = [], {}, {}
        for i, chunks in self.span_keys.items():
            name = self.steps[i].name
            arr, offsets = sd.bucket_sorted(chunks, buckets)
            files += [(_path(ctx, name, f"keys_{unit:06d}", "npy"), arr),
                      (_path(ctx, name, f"offsets_{unit:06d}", "npy"), offsets)]
            counts[name] = len(arr)
        for i, k in self.keys.items():
            name = self.steps[i].name
            arr, offsets = dd.bucket_sorted(k, buckets)
            files += [(_path(ctx, name, f"keys_{unit:06d}", "npy"), arr),
                      (_path(ctx, name, f"offsets_{unit:06d}", "npy"), offsets)]
            if i in self.sigs:
                num_perm = self.steps[i].cfg.num_perm
                sa = np.stack(self.sigs[i]) if self.sigs[i] else np.zeros((0, num_perm), np.uint32)
                files += [(_path(ctx, name, f"sigs_{unit:06d}", "npy"), sa),
                          (_path(ctx, name, f"sigrefs_{unit:06d}", "npy"), np.array(self.sig_refs[i], np.uint64))]
            counts[name] = len(self.sig_refs[i]) if i in self.sigs else len(k)
        for i, v in self.verdicts.items():
            path, codes = verdict_path(ctx, self.steps[i].name, unit), np.frombuffer(bytes(v), np.uint8)
            files.append((path, codes))
            entries[self.steps[i].name] = vd.marker_entry(os.path.basename(path), codes, _npy_bytes(codes))
        doc_entry = None
        if self.doc_steps:
            path, codes = doc_codes_path(ctx, unit), np.array(self.doc_codes, np.uint32)
            files.append((path, codes))
            doc_entry = vd.marker_entry(os.path.basename(path), codes, _npy_bytes(codes))
            doc_entry["reasons"] = [list(k) for k, _ in sorted(self.reasons.items(), key=lambda kv: kv[1])]
        return files, counts, entries, doc_entry


def verdict_path(ctx: CurateContext, step: str, unit: int) -> str:
    return _path(ctx, step, f"verdicts_{unit:06d}", "npy")


def doc_codes_path(ctx: CurateContext, unit: int) -> str:
    return _path(ctx, f"doc_steps_{unit:06d}", "npy")


def hash_unit(unit: Unit, ctx: CurateContext) -> dict:
    """Keys of every document that reaches each dedup step (filters before it applied), bucketed, and the quality
    verdicts on the way; then the marker (which ties the verdict files to this run: verdicts.py)."""
    acc = _UnitHashes(ctx.steps.steps)
    rep = _Reporter(unit.index)
    try:
        for _, _, ordinal, text, _, record in _records(unit, ctx):
            if text is None:
                acc.reject()
                continue
            acc.add(dd.make_ref(unit.index, ordinal), text, record)
            rep.add(len(text))
    except (InputError, MemoryError) as e:
        return _failure(unit, e)
    rep.flush()
    os.makedirs(ctx.dedup_dir, exist_ok=True)
    files, counts, verdicts, doc_entry = acc.files(ctx, unit.index, ctx.steps.buckets)
    _save_npys(files)
    marker = {"fingerprint": ctx.fp, "unit": unit.name, "key": unit.key(), "documents": counts}
    if verdicts:
        marker["verdicts"] = verdicts
    if doc_entry:
        marker["doc_steps"] = doc_entry
    io.atomic_write(hash_marker(ctx, unit.index), orjson.dumps(marker))
    return {"ok": True}


# --- pass 2: buckets ----------------------------------------------------------------------------------------------


class _Signatures:
    """Signature lookup by ref across the units' signature files (memory-mapped, opened on first use)."""

    def __init__(self, ctx: CurateContext, step: str):
        self.ctx, self.step, self.open = ctx, step, {}

    def __call__(self, ref: int) -> np.ndarray:
        u = dd.ref_unit(ref)
        if u not in self.open:
            self.open[u] = (_load_npy(_path(self.ctx, self.step, f"sigrefs_{u:06d}", "npy")),
                            _load_npy(_path(self.ctx, self.step, f"sigs_{u:06d}", "npy")))
        refs, sigs = self.open[u]
        return np.asarray(sigs[int(np.searchsorted(refs, np.uint64(ref)))])


def bucket_task(bucket: Bucket, ctx: CurateContext) -> dict:
    """This bucket's slice of every unit's keys -> exact (removed, keeper) pairs / MinHash confirmed edges."""
    b = bucket.index
    out, files = {}, []
    for step in ctx.steps.dedup_steps:
        parts = []
        for u in range(ctx.units):
            offsets = _load_npy(_path(ctx, step.name, f"offsets_{u:06d}", "npy"), mmap=False)
            if offsets[b + 1] > offsets[b]:
                keys = _load_npy(_path(ctx, step.name, f"keys_{u:06d}", "npy"))
                parts.append(np.array(keys[offsets[b]:offsets[b + 1]]))
        if step.is_span_dedup:
            res = sd.duplicate_windows(np.concatenate(parts) if parts else np.zeros(0, sd.SPAN_DTYPE))
            files.append((_path(ctx, step.name, f"removed_{b:05d}", "npy"), res))
            out[step.name] = len(res)
            continue
        arr = dd.sort_entries(np.concatenate(parts)) if parts else np.zeros(0, dd.KEY_DTYPE)
        if step.kind == "exact_dedup":
            res = dd.exact_removed(arr)
            files.append((_path(ctx, step.name, f"removed_{b:05d}", "npy"), res))
        else:
            res = dd.minhash_edges(arr, _Signatures(ctx, step.name), step.cfg.threshold)
            files.append((_path(ctx, step.name, f"edges_{b:05d}", "npy"), res))
        out[step.name] = len(res)
    _save_npys(files)
    progress.report(b, 1, 0, 1)
    io.atomic_write(bucket_marker(ctx, b), orjson.dumps({"fingerprint": ctx.fp, "bucket": b, "pairs": out}))
    return {"ok": True}


# --- pass 3: clusters (MinHash) -----------------------------------------------------------------------------------


def cluster_pass(ctx: CurateContext) -> None:
    """Union-find over every bucket's confirmed edges (duplicates only): each cluster keeps its smallest ref."""
    for step in ctx.steps.dedup_steps:
        if step.kind != "minhash_dedup":
            continue
        edges = [np.array(_load_npy(_path(ctx, step.name, f"edges_{b:05d}", "npy"), mmap=False))
                 for b in range(ctx.steps.buckets)]
        allx = np.concatenate(edges) if edges else np.zeros(0, dd.PAIR_DTYPE)
        _save_npy(_path(ctx, step.name, "removed", "npy"), dd.clusters_removed(allx))
    # Two bucket tasks finishing together may both run this pass: identical content, one temporary name each.
    io.atomic_write(cluster_marker(ctx), orjson.dumps({"fingerprint": ctx.fp}), shared=True)


# --- pass 4: the filter decision per document ---------------------------------------------------------------------


class DocGate:
    """``check(text, ordinal, record)`` -> None (keep) or (step name, reason, duplicate_of or None), steps in
    order; after it, ``text`` is the document as the steps left it and ``fields`` what they added."""

    def __init__(self, ctx: CurateContext, unit_index: int):
        self.checks: List[Tuple[str, object]] = []
        self.text, self.fields = "", None
        carried = _carried_verdicts(ctx, unit_index)
        # the hash pass's per-document step outcomes: a removal is reused, and the steps that neither rewrite nor
        # add fields (evaluated there, passed) are not evaluated again
        self.doc_codes, self.doc_reasons = _carried_doc_codes(ctx, unit_index)
        last = max((i for i, s in enumerate(ctx.steps.steps) if s.is_dedup), default=-1)
        self.skip_if_passed = {s.name for s in ctx.steps.steps[:last] if ds.is_doc_step(s) and s.kind in PURE_FILTERS}
        for step in ctx.steps.steps:
            if _kernel_quality(step):
                self.checks.append((step.name, vd.CarriedQuality(QualityFilter(step.cfg), carried.get(step.name))))
                continue
            if ds.is_doc_step(step):
                self.checks.append((step.name, ds.build(step)))
                continue
            if step.is_span_dedup:
                self.checks.append((step.name, sd.SpanCutter(step, _span_cuts(ctx, step, unit_index))))
                continue
            if step.kind == "exact_dedup":
                pairs = [dd.unit_slice(_load_npy(_path(ctx, step.name, f"removed_{b:05d}", "npy")), unit_index)
                         for b in range(ctx.steps.buckets)]
                pairs = [np.array(p) for p in pairs if len(p)]
            else:
                p = dd.unit_slice(_load_npy(_path(ctx, step.name, "removed", "npy")), unit_index)
                pairs = [np.array(p)] if len(p) else []
            removed = {dd.ref_ordinal(r): k for p in pairs for r, k in zip(p["ref"].tolist(), p["keeper"].tolist())}
            self.checks.append((step.name, (REASONS[step.kind], removed)))

    def check(self, text: str, ordinal: int, record: Optional[dict] = None) -> Optional[Tuple[str, str, Optional[str]]]:
        doc = ds.Doc(text, record)
        self.text, self.fields = text, None
        carried = None  # (step, reason) of the hash pass, or () when no per-document step removed the record there
        if self.doc_codes is not None and ordinal < len(self.doc_codes):
            code = int(self.doc_codes[ordinal])
            carried = self.doc_reasons[code - 1] if code else ()
        for name, how in self.checks:
            if isinstance(how, vd.CarriedQuality):
                why = how.check(doc.text, ordinal)
                if why is not None:
                    return name, why, None
            elif isinstance(how, ds.DocStep):
                if carried:  # removed by a later step: nothing before it needs the text
                    if carried[0] == name:
                        return name, carried[1], None
                    continue
                if carried is not None and name in self.skip_if_passed:
                    continue
                why = how.apply(doc)
                if why is not None:
                    return name, why, None
            elif isinstance(how, sd.SpanCutter):
                why = how.cut(doc, ordinal)
                if why is not None:
                    return name, why, None
            else:
                reason, removed = how
                keeper = removed.get(ordinal)
                if keeper is not None:
                    return name, reason, dd.ref_name(keeper)
        self.text, self.fields = doc.text, doc.fields
        return None

    def modified(self) -> Dict[str, Dict[str, int]]:
        """{step: {reason: occurrences}} of what the steps rewrote in this unit's kept documents."""
        out = {}
        for name, how in self.checks:
            counts = getattr(how, "modified", None)
            if counts:
                out[name] = dict(sorted(counts.items()))
        return dict(sorted(out.items()))


# per-document steps that only remove (no rewrite, no field): passed in the hash pass, not evaluated again
PURE_FILTERS = ("url_filter", "fineweb", "quality", "decontaminate")


def _carried_doc_codes(ctx: CurateContext, unit_index: int):
    """(per-ordinal codes, [(step, reason)]) of the unit's hash pass, when its marker carries this run's fingerprint
    and the file matches the marker's entry; else (None, None): every step is evaluated here."""
    last = max((i for i, s in enumerate(ctx.steps.steps) if s.is_dedup), default=-1)
    if not any(ds.is_doc_step(s) for s in ctx.steps.steps[:last]):
        return None, None
    marker = marker_ok(hash_marker(ctx, unit_index), ctx.fp) or {}
    entry = marker.get("doc_steps")
    codes, why = vd.load(doc_codes_path(ctx, unit_index), entry, np.uint32)
    if codes is None:
        log.warning("shard_%06d: evaluating the per-document steps again: %s", unit_index,
                    why if marker else "no hash marker of this run")
        return None, None
    return codes, [tuple(r) for r in entry["reasons"]]


def _span_cuts(ctx: CurateContext, step, unit_index: int) -> Dict[int, np.ndarray]:
    """Record ordinal -> the positions of its duplicate windows (every bucket's cut list, this unit's range)."""
    parts = [dd.unit_slice(_load_npy(_path(ctx, step.name, f"removed_{b:05d}", "npy")), unit_index)
             for b in range(ctx.steps.buckets)]
    parts = [np.array(p) for p in parts if len(p)]
    if not parts:
        return {}
    allp = np.concatenate(parts)
    allp = allp[np.lexsort((allp["pos"], allp["ref"]))]
    refs = allp["ref"]
    bounds = np.flatnonzero(np.concatenate(([True], refs[1:] != refs[:-1], [True])))
    return {dd.ref_ordinal(int(refs[a])): allp["pos"][a:b].astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:])}


def _carried_verdicts(ctx: CurateContext, unit_index: int) -> Dict[str, np.ndarray]:
    """The hash pass's verdicts of this unit's quality steps (those before the last dedup step), each used only
    when the unit's hash marker carries this run's fingerprint and the file matches the marker's entry for it."""
    dedup = [i for i, s in enumerate(ctx.steps.steps) if s.is_dedup]
    names = [s.name for s in ctx.steps.steps[:max(dedup)] if _kernel_quality(s)] if dedup else []
    if not names:
        return {}
    marker = marker_ok(hash_marker(ctx, unit_index), ctx.fp) or {}
    out = {}
    for name in names:
        codes, why = vd.load(verdict_path(ctx, name, unit_index), (marker.get("verdicts") or {}).get(name))
        if codes is None:
            log.warning("shard_%06d: step %s: evaluating the quality rules again: %s", unit_index, name,
                        why if marker else "no hash marker of this run")
        else:
            out[name] = codes
    return out


def curated_path(out_dir: str, unit_name: str) -> str:
    return os.path.join(out_dir, unit_name + ".jsonl")


def stats_path(out_dir: str, unit_name: str) -> str:
    return os.path.join(out_dir, unit_name + ".curated.json")


def filter_unit(unit: Unit, ctx: CurateContext) -> dict:
    """The jsonl output mode: kept documents to ``shard_NNNNNN.jsonl`` (each its input record, every field kept, the
    text as the steps left it and their fields added), removals and rejects logged, then
    ``shard_NNNNNN.curated.json`` (the unit's counts; its completion marker)."""
    out = ctx.output_dir
    gate = DocGate(ctx, unit.index)
    removals, rejects = RemovalLog(out, unit.name), RejectLog(out, unit.name)
    path = curated_path(out, unit.name)
    tmp = path + ".tmp"
    f = io.open_write(tmp)
    records = kept = 0
    rep = _Reporter(unit.index)
    try:
        for piece, pos, ordinal, text, reason, record in _whole_records(unit, ctx):
            records += 1
            if text is None:
                rejects.add(piece.path, position_kind(piece), pos, reason)
                continue
            why = gate.check(text, ordinal, record)
            if why is not None:
                removals.remove(piece.path, position_kind(piece), pos, *why)
            else:
                f.write(kept_record(record, ctx.text_field, gate.text, gate.fields))
                kept += 1
            rep.add(len(text))
        io.fsync_file(f)
        f.close()
        io.commit(tmp, path)
        removals.commit()
        rejects.commit()
    except BaseException as e:
        f.close()
        io.remove(tmp)
        removals.abort()
        rejects.abort()
        if isinstance(e, (InputError, MemoryError)):
            return _failure(unit, e)
        raise
    rep.flush()
    stats = {"unit": unit.name, "key": unit.key(), "fingerprint": ctx.fp, "file": os.path.basename(path),
             "bytes": io.size(path), "input_records": records, "documents": kept,
             "inputs": [p.as_dict() for p in unit.pieces],
             "rejected": dict(sorted(rejects.counts.items())), "removed": removals.summary(),
             "modified": gate.modified()}
    if records != kept + sum(rejects.counts.values()) + sum(removals.counts.values()):
        raise AssertionError(f"{unit.name}: records do not balance")
    io.atomic_write(stats_path(out, unit.name), orjson.dumps(stats, option=orjson.OPT_INDENT_2))
    return {"ok": True, "stats": stats}

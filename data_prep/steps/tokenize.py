"""The tokenize step: one work unit's records -> documents of token ids -> its shard, reject log and stats marker.

``tokenize_unit`` is the task an executor runs for each unit (in a pool worker, a Ray task or in-process); it returns
the unit's stats, or a failure record when an input cannot be read, so the other units carry on. Its outputs appear
in this order, each atomically: shard (.bin then .idx), reject log, then ``shard_NNNNNN.stats.json``, the unit's
completion marker; a unit killed before its marker is redone from scratch on resume.

Per worker process, the tokenizer and its fast-path encoder are loaded once and self-checked on the first documents;
a pool forked from the driver starts from the driver's (``preload``), self-checked there on the first documents of the
first unit to do, so workers neither load nor check it again (a Ray task or another node checks its own).
"""

from __future__ import annotations

import os
import time
from typing import List, Optional

import numpy as np

import data_prep.write.manifest as mf
from data_prep import io, progress
from data_prep.read.formats import TOO_LONG, InputError, Piece, position_kind, read_piece
from data_prep.read.units import Unit
from data_prep.settings import Settings
from data_prep.steps.fast_path import FastEncoder, FastPathMismatch
from data_prep.steps.tokenizers import Tokenizer, TokenizerInfo, load_tokenizer, optimal_dtype
from data_prep.write.rejects import RejectLog
from data_prep.write.removals import RemovalLog
from data_prep.write.shards import ShardWriter

SELF_CHECK_DOCS, SELF_CHECK_CHARS = 32, 64_000
# This process's tokenizer info and encoder: {"info", "enc_key", "enc", "enc_checked"}.
_STATE: dict = {}


def preload(settings: Settings, tok: Tokenizer, enc: FastEncoder, first: Optional[Unit] = None) -> None:
    """Hand the driver's tokenizer and encoder to the units run in this process and in workers forked from it. With
    ``first`` (the first unit to do), the encoder is self-checked here on its first documents, once, instead of in
    every worker (the library's encode of the sample is most of a worker's start-up); a sample that cannot be read
    leaves the check to the workers, which report the input's error as usual."""
    checked = False
    if first is not None and enc.active:
        try:
            sample = _first_texts(first, settings)
        except InputError:
            sample = []
        if sample:
            enc.self_check(sample)
            checked = True
    _STATE.update(info=tok.info, enc_key=_encoder_key(settings), enc=enc, enc_checked=checked)


def _first_texts(unit: Unit, settings: Settings) -> List[str]:
    """The self-check's sample: the unit's first documents, up to SELF_CHECK_DOCS / SELF_CHECK_CHARS."""
    texts: List[str] = []
    chars = 0
    for piece in unit.pieces:
        for _, text, _ in read_piece(piece, settings.text_field, settings.max_record_size):
            if text is not None:
                texts.append(text)
                chars += len(text)
                if len(texts) >= SELF_CHECK_DOCS or chars >= SELF_CHECK_CHARS:
                    return _sample(texts)
    return _sample(texts)


def _sample(texts: List[str]) -> List[str]:
    check, chars = [], 0
    for t in texts[:SELF_CHECK_DOCS]:
        if check and chars + len(t) > SELF_CHECK_CHARS:
            break
        check.append(t)
        chars += len(t)
    return check


def _encoder_key(settings: Settings) -> tuple:
    return settings.tokenizer, settings.eod_id, settings.fast_path


def _tokenizer_info(settings: Settings) -> TokenizerInfo:
    info = _STATE.get("info")
    if info is None or info.path != os.path.abspath(settings.tokenizer):
        info = load_tokenizer(settings.tokenizer, settings.eod_id).info
        _STATE["info"] = info
    return info


def _encoder(settings: Settings, sample: List[str]) -> FastEncoder:
    key = _encoder_key(settings)
    if _STATE.get("enc_key") != key or not _STATE.get("enc_checked"):
        # A forked worker inherits the driver's encoder (not yet self-checked): no second load per worker.
        enc = _STATE.get("enc") if _STATE.get("enc_key") == key else None
        if enc is None:
            enc = FastEncoder(load_tokenizer(settings.tokenizer, settings.eod_id), enabled=settings.fast_path)
        # self-check on the first documents, up to ~64k characters: the library's own encode of them is the cost
        # (sentencepiece ~1.5 MB/s: 0.05 s per worker; 256k characters cost 0.2 s of every worker's start)
        enc.self_check(_sample(sample))
        _STATE.update(enc_key=key, enc=enc, enc_checked=True)
    return _STATE["enc"]


class _UnitRun:
    def __init__(self, unit: Unit, settings: Settings, fp: str):
        self.unit, self.s, self.fp = unit, settings, fp
        # written here, then (for a URL output) uploaded: an object store has no rename to make a file appear whole
        self.work = settings.work_dir()
        os.makedirs(self.work, exist_ok=True)  # a staging dir on a Ray node other than the driver's
        self.prefix = os.path.join(self.work, unit.name)
        self.records = 0
        self.seen_docs = 0
        self.rejects = RejectLog(self.work, unit.name)
        self.writer: Optional[ShardWriter] = None
        self.enc: Optional[FastEncoder] = None
        self.last_report = time.monotonic()
        self.pending = [0, 0, 0]  # docs, tokens, chars since the last progress report
        # curation (--steps): filters and dedup decide per document before it is tokenized
        self.gate = self.removals = None
        if settings.curation is not None:
            from data_prep.steps.curate import DocGate

            self.gate = DocGate(settings.curation, unit.index)
            self.removals = RemovalLog(self.work, unit.name)

    def reject(self, piece: Piece, pos: int, reason: str) -> None:
        self.rejects.add(piece.path, position_kind(piece), pos, reason)

    def flush_batch(self, batch):
        if not batch:
            return
        texts = [t for _, _, t in batch]
        if self.enc is None:
            self.enc = _encoder(self.s, texts)
        flat, offsets = self.enc.encode_flat(texts)
        if self.s.verify_fraction > 0:
            self._verify(texts, flat, offsets)
        lengths = np.diff(offsets)
        s, info = self.s, self.enc.tok.info
        head = [info.bos_id] if s.add_bos and info.bos_id is not None else []
        tail = [info.eod_id] if s.append_eod else []
        if len(lengths) and int(lengths.max()) + len(head) + len(tail) <= s.max_doc_tokens:
            ntok = self._add_all(flat, offsets, lengths, head, tail)
        else:
            ntok = self._add_each(batch, flat, offsets, head, tail)
        self._progress(len(batch), ntok, sum(len(t) for t in texts))

    def _add_all(self, flat, offsets, lengths, head, tail) -> int:
        """Every document of the batch is one sequence: BOS/EOD put in place with one numpy call each, one write."""
        dtype = self.writer.dtype
        out = flat.astype(dtype)
        if tail:
            out = np.insert(out, offsets[1:], np.asarray(tail, dtype=dtype))
        if head:
            starts = offsets[:-1] + (np.arange(len(lengths)) if tail else 0)
            out = np.insert(out, starts, np.asarray(head, dtype=dtype))
        self.writer.add_documents(out, lengths + len(head) + len(tail))
        return len(out)

    def _add_each(self, batch, flat, offsets, head, tail) -> int:
        """Document by document: some are longer than --max-doc-tokens (split, or rejected)."""
        s, dtype = self.s, self.writer.dtype
        head, tail = np.asarray(head, dtype=dtype), np.asarray(tail, dtype=dtype)
        ntok = 0
        for k, (piece, pos, _) in enumerate(batch):
            arr = np.concatenate([head, flat[offsets[k] : offsets[k + 1]].astype(dtype, copy=False), tail])
            if len(arr) > s.max_doc_tokens:
                if s.long_docs == "reject":
                    self.reject(piece, pos, TOO_LONG)
                    continue
                seqs = [arr[i : i + s.max_doc_tokens] for i in range(0, len(arr), s.max_doc_tokens)]
            else:
                seqs = [arr]
            self.writer.add_document(seqs)
            ntok += len(arr)
        return ntok

    def _verify(self, texts, flat, offsets):
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
                if list(want) != flat[offsets[i] : offsets[i + 1]].tolist():
                    raise FastPathMismatch(
                        f"fast path differs from whole-document encoding in {self.unit.name} (document {i} of a "
                        "batch); rerun with --no-fast-path and report the tokenizer")

    def _progress(self, docs, toks, chars):
        p = self.pending
        p[0] += docs
        p[1] += toks
        p[2] += chars
        now = time.monotonic()
        if progress.watched() and now - self.last_report > 0.5:
            progress.report(self.unit.index, *p)
            self.pending, self.last_report = [0, 0, 0], now

    def _publish(self) -> None:
        """Upload the unit's files from the staging dir to a URL output (data first; the caller writes the stats
        marker after, so a marker never points at a partial upload); remove stale ones of an earlier run."""
        if self.work == self.s.output_dir:
            return
        out = self.s.output_dir
        for suffix in (".bin", ".idx", ".rejects.jsonl", ".removed.jsonl"):
            local, dest = self.prefix + suffix, io.join(out, self.unit.name + suffix)
            if os.path.exists(local):
                io.publish(local, dest)
            else:
                io.remove(dest)

    def run(self) -> dict:
        s = self.s
        # The dtype needs the vocabulary size; the encoder is made lazily, so read it from the tokenizer's info.
        self.writer = ShardWriter(self.prefix, optimal_dtype(_tokenizer_info(s).vocab_size))
        try:
            batch, chars = [], 0
            for piece in self.unit.pieces:
                for pos, text, reason in read_piece(piece, s.text_field, s.max_record_size):
                    self.records += 1
                    if text is None:
                        self.reject(piece, pos, reason)
                        continue
                    if self.gate is not None:
                        why = self.gate.check(text, self.records - 1)  # ordinal: every record, as the hash pass
                        if why is not None:
                            self.removals.remove(piece.path, position_kind(piece), pos, *why)
                            continue
                    batch.append((piece, pos, text))
                    chars += len(text)
                    if len(batch) >= s.batch_docs or chars >= s.batch_chars:
                        self.flush_batch(batch)
                        batch, chars = [], 0
            self.flush_batch(batch)
            progress.report(self.unit.index, *self.pending)
            if self.writer.documents:
                shard = self.writer.finalize()
            else:  # megatron cannot mmap an empty .bin: a unit with no documents has stats but no shard
                self.writer.abort()
                shard = {"documents": 0, "sequences": 0, "tokens": 0, "bytes": 0, "idx_bytes": 0,
                         "sha256_bin": None, "sha256_idx": None}
                for suffix in (".bin", ".idx"):
                    io.remove(self.prefix + suffix)
            self.rejects.commit()
            if self.removals is not None:
                self.removals.commit()
            self._publish()
        except BaseException:
            # a full disk (ENOSPC) in the middle of finalize included: no temporary file is left behind, and
            # without its stats marker nothing this unit wrote is trusted by a rerun
            self.writer.abort()
            self.rejects.abort()
            if self.removals is not None:
                self.removals.abort()
            raise
        rejected = self.rejects.counts
        stats = {
            "unit": self.unit.name,
            "key": self.unit.key(),
            "fingerprint": self.fp,
            "prefix": self.unit.name if shard["documents"] else None,
            **shard,
            "input_records": self.records,
            "inputs": [{"path": p.path, "kind": p.kind, "start": p.start, "end": p.end} for p in self.unit.pieces],
            "rejected": dict(sorted(rejected.items())),
        }
        removed = 0
        if self.removals is not None:
            stats["removed"] = self.removals.summary()
            removed = sum(self.removals.counts.values())
        if self.records != shard["documents"] + sum(rejected.values()) + removed:
            raise AssertionError(f"{self.unit.name}: records do not balance")
        io.atomic_write(mf.stats_path(s.output_dir, self.unit.name), mf.dumps(stats))
        return stats


def tokenize_unit(unit: Unit, settings: Settings, fp: str) -> dict:
    """Run one unit: {"ok": True, "stats": ...}, or {"ok": False, "unit", "path", "error"} when an input cannot be
    read (recorded in the unit's error file, not raised, so other units carry on). Anything else raises."""
    err_path = mf.error_path(settings.output_dir, unit.name)
    io.configure(settings.storage_options, settings.upload_part_size)  # a Ray worker starts without the driver's
    try:
        stats = _UnitRun(unit, settings, fp).run()
    except (InputError, MemoryError) as e:
        # MemoryError: a memory limit (ulimit -v, a cgroup without swap...) hit by this unit; it fails alone
        path, why = (e.path, e.why) if isinstance(e, InputError) else (
            ", ".join(p.path for p in unit.pieces),
            "out of memory in this unit (lower --max-record-size or --workers, or raise the memory limit)")
        res = {"ok": False, "unit": unit.name, "path": path, "error": why}
        io.atomic_write(err_path, mf.dumps({k: res[k] for k in ("unit", "path", "error")}))
        return res
    io.remove(err_path)
    return {"ok": True, "stats": stats}

"""Span dedup: repeated spans removed from documents, globally, with the sharded passes of exact and MinHash dedup.

``sentence_dedup`` (C4's and datatrove's SentenceDedup): every span of ``n_sentences`` consecutive sentences (3) that
occurred earlier in the corpus is cut from the document; a document left with fewer than ``min_doc_words`` words is
removed. ``substring_dedup`` (Lee et al. 2021, "Deduplicating training data makes language models better"): every
substring of ``min_words`` or more words (whitespace words, exact, case kept) that occurred earlier is cut.

How, in the passes of steps/curate.py (a document's units: its sentences, or its words):
1. hash pass: each window of n consecutive units gets a 128-bit key (each unit hashed once, xxh3-64 of its
   normalised sentence / its UTF-8 word; the window's two 64-bit halves combined from them with two sets of position
   weights: kernels.shingle_hashes) stored with (ref, window position), partitioned by key into the run's buckets:
   no process holds every key;
2. bucket pass: the owner of a bucket sorts its windows by (key, ref, position): the windows of a key are the
   occurrences of one n-unit sequence, in corpus order; all but the first are duplicates (ref, position);
3. filter pass: a unit's duplicate windows mark their n units each; the marked units are cut from the text (with
   the whitespace after them) and counted under ``modified``.
A repeated substring of L >= n units is exactly the union of its L - n + 1 windows, each repeated too, so the units
cut are those a suffix array would find for "occurs earlier, at least n units long": the sort of step 2 is the suffix
sort truncated to n units, partitioned by key (not a full suffix array: no longest-match lengths are kept, and none
are needed to cut the spans). The first occurrence stays, as the other dedup steps keep their smallest ref.

Limits (validated): at most one span step per run, after every other dedup step (the hash pass cannot see the text
another span step will cut). A span step counts the windows of documents an earlier dedup step removes (their first
occurrences still cut later copies), as running datatrove's steps in one pipeline would not; run it in a second
curate over the first one's output for the strict order.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

SPAN_DTYPE = np.dtype([("h", "<u8"), ("h2", "<u8"), ("ref", "<u8"), ("pos", "<u4")])
CUT_DTYPE = np.dtype([("ref", "<u8"), ("pos", "<u4")])
# a sentence: up to a run of . ! ? (closing quotes or brackets after it) and the whitespace after, or to a newline
_SENTENCE = re.compile(r"[^\n]*?(?:[.!?\u3002\uff01\uff1f]+[\"'\u201d\u2019)\]]*(?:\s+|$)|\n+|$)")
_SPACE = re.compile(r"\s+")


class SentenceDedupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_sentences: int = Field(3, ge=1, le=64, description="sentences per span")
    min_doc_words: Optional[int] = Field(50, ge=0, description="fewer words left: the document is removed")


class SubstringDedupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_words: int = Field(50, ge=2, le=10_000, description="length of a repeated substring cut, in words")
    min_doc_words: Optional[int] = Field(None, ge=0, description="fewer words left: the document is removed")


class SpanUnits:
    """A document cut into units (sentences or words): their [start, end) character spans, each unit's end
    including the whitespace after it, and the window keys (h, h2) of every n consecutive units."""

    def __init__(self, kind: str, n: int):
        import xxhash

        from data_prep.steps import kernels

        self.kind, self.n, self.k, self.xxh = kind, n, kernels, xxhash.xxh3_64_intdigest
        rng = np.random.RandomState(7919 + n)
        self.w1, self.w2 = (rng.randint(0, 2**63, size=(2, n), dtype=np.uint64) * np.uint64(2) + np.uint64(1))

    def spans(self, text: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, unit hashes), in text order."""
        if self.kind == "sentence":
            starts, ends, hashes = [], [], []
            for m in _SENTENCE.finditer(text):
                s = _SPACE.sub(" ", m.group()).strip().lower()
                if s:
                    starts.append(m.start())
                    ends.append(m.end())
                    hashes.append(self.xxh(s.encode("utf-8", "surrogatepass")))
            return (np.array(starts, np.int64), np.array(ends, np.int64), np.array(hashes, np.uint64))
        k = self.k
        cps = k.code_points(text)
        starts, ends = k.scan_words(cps, k.char_tables())[:2]
        wh, long_words = k.word_hashes(cps, starts, ends, k.XXH3_SECRET)
        if len(long_words):
            for i in long_words.tolist():
                wh[i] = self.xxh(text[starts[i]:ends[i]].encode("utf-8", "surrogatepass"))
        nxt = np.append(starts[1:], len(text))  # a word's span runs to the next word: its whitespace goes with it
        return starts, nxt, wh

    def windows(self, text: str) -> Tuple[np.ndarray, np.ndarray]:
        """The (h, h2) keys of every window of n consecutive units (empty when the text has fewer)."""
        _, _, wh = self.spans(text)
        if len(wh) < self.n:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        return self.k.shingle_hashes(wh, self.w1, self.n), self.k.shingle_hashes(wh, self.w2, self.n)


def units_of(step) -> SpanUnits:
    if step.kind == "sentence_dedup":
        return SpanUnits("sentence", step.cfg.n_sentences)
    return SpanUnits("word", step.cfg.min_words)


def window_entries(units: SpanUnits, text: str, ref: int) -> Optional[np.ndarray]:
    h, h2 = units.windows(text)
    if not len(h):
        return None
    out = np.empty(len(h), SPAN_DTYPE)
    out["h"], out["h2"], out["ref"], out["pos"] = h, h2, ref, np.arange(len(h), dtype=np.uint32)
    return out


def bucket_sorted(chunks: List[np.ndarray], buckets: int) -> Tuple[np.ndarray, np.ndarray]:
    """The unit's window entries grouped by bucket (h % buckets; in record order within it), and the bucket
    offsets. Memory: ~28 bytes a window while the unit is hashed (substring dedup: a window per word, so ~1.3 GB for
    a 256 MB unit of English: lower --shard-size for many workers)."""
    arr = np.concatenate(chunks) if chunks else np.zeros(0, SPAN_DTYPE)
    bucket = arr["h"] % np.uint64(buckets)
    order = np.argsort(bucket, kind="stable")  # by bucket only: the bucket pass sorts its entries itself
    arr = arr[order]
    offsets = np.searchsorted(bucket[order], np.arange(buckets + 1, dtype=np.uint64)).astype(np.int64)
    return arr, offsets


def duplicate_windows(arr: np.ndarray) -> np.ndarray:
    """A bucket's entries -> (ref, pos) of every window whose key occurred at a smaller (ref, pos), sorted."""
    if len(arr) < 2:
        return np.zeros(0, CUT_DTYPE)
    arr = arr[np.lexsort((arr["pos"], arr["ref"], arr["h2"], arr["h"]))]
    same = (arr["h"][1:] == arr["h"][:-1]) & (arr["h2"][1:] == arr["h2"][:-1])
    dup = arr[1:][same]
    out = np.empty(len(dup), CUT_DTYPE)
    out["ref"], out["pos"] = dup["ref"], dup["pos"]
    return np.sort(out, order=("ref", "pos"))


class SpanCutter:
    """The filter pass of a span step for one unit: ``cut(doc, ordinal)`` removes the duplicate windows' units."""

    def __init__(self, step, cuts: dict):
        self.step, self.units, self.cuts = step, units_of(step), cuts
        from collections import Counter

        self.modified: Counter = Counter()
        self.reason = "duplicate_sentences" if step.kind == "sentence_dedup" else "duplicate_words"

    def cut(self, doc, ordinal: int) -> Optional[str]:
        positions = self.cuts.get(ordinal)
        if positions is not None:
            starts, ends, _ = self.units.spans(doc.text)
            marked = np.zeros(len(starts) + 1, np.int64)
            np.add.at(marked, positions, 1)
            np.add.at(marked, np.minimum(positions + self.units.n, len(starts)), -1)
            gone = np.cumsum(marked[:-1]) > 0
            text, pieces, at = doc.text, [], 0
            for s, e in zip(starts[gone].tolist(), ends[gone].tolist()):
                pieces.append(text[at:s])
                at = e
            pieces.append(text[at:])
            doc.text = "".join(pieces).strip()
        if not doc.text:
            return "empty"
        need = self.step.cfg.min_doc_words
        if need and positions is not None and len(doc.text.split()) < need:
            return "short_after_dedup"
        if positions is not None:  # counted for the documents kept, as the line filters count theirs
            self.modified[self.reason] += int(gone.sum())
        return None

"""gigatoken (Rust, SIMD pre-tokenization, cached pre-token encodings) as the first fast path, where it gives the
library's ids: Hugging Face byte-level BPE tokenizer.json and sentencepiece BPE with byte fallback (its normalizer
honoured: gigatoken converts the .model to a tokenizer.json the way transformers does, keeping the precompiled
charsmap, whitespace collapsing and dummy prefix).

We feed it our own texts (our readers keep work units, byte ranges, record-size limits, rejects, resume, S3 and
``--slice`` as they are) a batch at a time, one ``encode`` call per text on the calling thread (one core per worker
process; no rayon pool, none inherited across a fork), and join its uint32 arrays into one flat array of ids plus
offsets, with no Python object per token and without awkward (its batch API's output type).

Three things it does differently from the libraries are handled here:
- sentencepiece never matches its control pieces (``<s>``, ``</s>``, ``<pad>``) in text; gigatoken does, as the
  tokenizers library does for a tokenizer.json's special tokens. A text holding one (as it reaches gigatoken: after
  sentencepiece's normalization on the path below, where case folding can make one) goes to the library whole.
- with remove_extra_whitespaces, sentencepiece strips spaces from the ends of the normalized text; the converted
  tokenizer.json strips every Unicode whitespace (HF ``Strip``). They differ on a text whose ends, past its spaces,
  are whitespace the model's normalizer keeps (``\n`` and ``\t`` for nfkc_cf, U+0085 for nmt_nfkc: probed from the
  model), or ends in a literal U+2581 (which sentencepiece strips at the end like a space, and not at the start).
  Such a text is normalized by sentencepiece itself and encoded by gigatoken's ``encode_no_normalize``; so is a text
  holding a character that joins a grapheme cluster (a combining mark...: see ``_has_cluster``).
- its encode cache (pre-token -> ids) grows with the variety of the text and has no bound in 0.10: peak RSS would
  grow with the corpus. ``CacheBound`` re-creates the encoder (a fresh, empty cache; ~0.1 s for a 32k vocabulary)
  whenever the process's resident memory has grown ``budget_mb`` (16) past what it was once warm, at most once per
  8 MB of text, so RSS stays flat from 1x to 10x the corpus (measured: README). The ids do not depend on the cache.
  A drop only gives the memory back if the cache's large tables are their own mappings: ``_pin_mmap_threshold``
  (glibc) keeps them so (why: there).
Anything else (unigram models, no byte fallback, a configuration gigatoken refuses) is refused at build with
gigatoken's reason; the caller still compares ids with the library's at start (FastEncoder.self_check) and falls
back with the reason in the log.
"""

from __future__ import annotations

import os
import re
from typing import List, Optional, Tuple

import numpy as np

CONTROL = 3  # sentencepiece piece type
# What HF's Strip normalizer strips (Rust's char::is_whitespace).
WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
              "\u200a\u2028\u2029\u202f\u205f\u3000")


# Blocks from this size up are mmapped (returned to the system when freed), whatever was freed before.
MMAP_THRESHOLD = 4 << 20


def _pin_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD (True where applied: glibc).

    glibc mmaps blocks from 128 KB up, but after a mmapped block is freed it raises that threshold to the freed size
    (up to 32 MB) and serves smaller blocks from the heap instead. The sentencepiece path with a normalizer freed
    large blocks before the encoders were built (the tokenizer.json conversion, then a copy without the normalizer,
    since replaced by ``encode_no_normalize``: orjson's parse and dump of the ~3 MB file, after which no block under
    32 MB was mmapped), so there the encoders and the cache's hash tables went to the heap: a drop left the freed
    pages resident between live blocks, the new encoders and cache touched heap pages not yet resident, and a
    worker's RSS climbed at each drop (nmt_nfkc, 10x corpus: 135 -> 160 MB across the first drop, 174 MB by the
    second; 1.29-1.40x the 1x peak). Fixed, the large tables stay mmapped and a drop unmaps them (a worker falls from
    131-137 to ~90 MB at each drop). Blocks under 4 MB (a batch's arrays) stay in the heap: a lower threshold
    mmapped each batch's arrays afresh (2-3x the page faults). Process-wide and inherited by forked workers; set
    before the encoders are built."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").mallopt(-3, MMAP_THRESHOLD) == 1  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc: nothing to pin
        return False


def _rss_mb() -> float:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class CacheBound:
    """When to drop gigatoken's encode cache: resident memory ``budget_mb`` above its level after warm-up (taken
    after ``warm_bytes`` of text, once the batch buffers and the first cache entries are in), and at least
    ``min_bytes`` of text since the last drop. RSS also holds each batch's transient arrays: without the second
    condition a batch-time peak just over the line dropped the cache batch after batch (measured before the mmap
    pin, when a drop gave nothing back: a reset every ~1.5 MB of text, each one a cold cache).

    The window is no longer than the warm-up: while it runs the cache grows on past the line, so a longer one lets
    the peak grow with the text a worker sees. At 32 MB (a worker of the 32 MB bench run sees 16 MB and never drops)
    the identity model's workers on the 320 MB corpus passed the line (115-119 MB) by up to 25 MB before a drop
    (peak 150 MB against 114 at 32 MB, 1.30x). RSS is back at ~base + 5 MB one batch after a drop, so an 8 MB
    window does not thrash: 6-9 drops per 160 MB of text instead of 4 (~0.1 s of CPU each; docs/fast_tokenize.md)."""

    def __init__(self, budget_mb: float = 16.0, warm_bytes: int = 8 << 20, min_bytes: int = 8 << 20):
        self.budget_mb, self.warm_bytes, self.min_bytes = budget_mb, warm_bytes, min_bytes
        self.seen = 0
        self.since = 0  # text since the last drop
        self.base: Optional[float] = None
        self.resets = 0

    def after_batch(self, nbytes: int) -> bool:
        """True when the cache should be dropped now."""
        self.seen += nbytes
        self.since += nbytes
        if self.seen < self.warm_bytes:
            return False
        rss = _rss_mb()
        if self.base is None:
            self.base = rss
            return False
        if self.since >= self.min_bytes and rss > self.base + self.budget_mb:
            self.resets += 1
            self.since = 0
            return True
        return False


class GigatokenBPE:
    """Encode texts with gigatoken (``build`` decides whether it can give the library's ids)."""

    def __init__(self, tokenizer_json, specials: List[str], bound: Optional[CacheBound] = None,
                 survivors: str = "", normalize=None):
        from gigatoken.gigatoken_rs import load_hf_json

        self.pinned = _pin_mmap_threshold()  # before the encoders and their cache exist
        self._load = load_hf_json
        self.json = tokenizer_json
        self.specials = specials  # texts holding one go to the library
        # found with one memchr per distinct first character (sentencepiece's control pieces all start with "<"),
        # then one regex pass for the texts holding one: 5x less CPU than a substring search per piece (web text)
        pieces = [p for p in specials if p]
        self._special_firsts = sorted({p[0] for p in pieces})
        self._special_rx = re.compile("|".join(map(re.escape, pieces)))
        self.bound = bound or CacheBound()
        # whitespace the model's normalizer keeps: a text ending in it (or any non-ASCII text) goes through
        # ``normalize`` and then the same encoder's ``encode_no_normalize`` (one encoder, one cache)
        self.survivors, self.normalize = survivors, normalize
        self.trailing = survivors + "\u2581" if normalize is not None else ""
        if normalize is not None:
            _has_cluster("")  # the table, built here in the driver: forked workers share it
        self._reset_cache()
        if normalize is not None and not hasattr(self.backend, "encode_no_normalize"):
            raise ValueError("this gigatoken has no encode_no_normalize (0.10 has it)")

    @classmethod
    def build(cls, tok) -> Tuple[Optional["GigatokenBPE"], Optional[str]]:
        """(encoder, None) or (None, why gigatoken is not used) for a data_prep Tokenizer."""
        from data_prep.steps.tokenizers import HFTokenizer, SentencePieceTokenizer

        try:
            from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json
        except ImportError:
            return None, "gigatoken is not installed"
        specials: List[str] = []
        try:
            if isinstance(tok, SentencePieceTokenizer):
                from sentencepiece import sentencepiece_model_pb2 as pb

                proto = tok.sp.serialized_model_proto()
                m = pb.ModelProto()
                m.ParseFromString(proto)
                if m.trainer_spec.model_type != 2:
                    return None, "not a BPE model (gigatoken runs sentencepiece BPE only)"
                specials = [p.piece for p in m.pieces if p.type == CONTROL]
                data = sentencepiece_to_tokenizer_json(proto)
                if m.normalizer_spec.remove_extra_whitespaces:
                    kept = "".join(c for c in WHITESPACE if c != " " and c in tok.sp.normalize("x" + c))
                    return cls(data, specials, survivors=kept, normalize=tok.sp.normalize), None
            elif isinstance(tok, HFTokenizer):
                data = tok.tok.to_str()
            else:
                return None, "unknown tokenizer type"
            return cls(data, specials), None
        except Exception as e:  # gigatoken refuses what it cannot run, with its reason
            return None, f"gigatoken refused it ({e})"

    def _reset_cache(self) -> None:
        self.backend = None  # the old cache is freed before the new encoder is built
        self.backend = self._load(self.json)

    def _ends_in_kept_whitespace(self, text: str) -> bool:
        """Whether sentencepiece and the converted normalizer strip this text's ends differently."""
        if not text:
            return False
        first, last = text[0], text[-1]
        if first == " " or last == " ":  # only then copy the text to look past its spaces
            t = text.strip(" ")
            if not t:
                return False
            first, last = t[0], t[-1]
        return first in self.survivors or last in self.trailing

    def _has_special(self, text: str) -> bool:
        return any(c in text for c in self._special_firsts) and self._special_rx.search(text) is not None

    def encode_flat(self, texts: List[str], library) -> Tuple[np.ndarray, np.ndarray]:
        """(ids of all texts, one after another, as uint32; offsets, len(texts) + 1 int64). ``library(texts)``
        encodes the texts gigatoken would not give the library's ids for (a control piece in the text as it reaches
        gigatoken)."""
        normal, raw, lib, normalized = [], [], [], []
        for i, t in enumerate(texts):
            if self.trailing and (self._ends_in_kept_whitespace(t) or not t.isascii() and _has_cluster(t)):
                raw.append(i)  # isascii: O(1) in CPython
            elif self.specials and self._has_special(t):
                lib.append(i)
            else:
                normal.append(i)
        if raw:
            normalized = self.normalize([texts[i] for i in raw])
            if self.specials:
                special = [self._has_special(t) for t in normalized]
                lib += [i for i, sp in zip(raw, special) if sp]
                raw = [i for i, sp in zip(raw, special) if not sp]
                normalized = [t for t, sp in zip(normalized, special) if not sp]
        if not raw and not lib:
            out = _flat(self.backend.encode, texts)
        else:
            groups = [(normal, _flat(self.backend.encode, [texts[i] for i in normal])),
                      (raw, _flat(self.backend.encode_no_normalize, normalized))]
            if lib:
                whole = [np.asarray(ids, dtype=np.uint32) for ids in library([texts[i] for i in lib])]
                offsets = np.zeros(len(lib) + 1, dtype=np.int64)
                np.cumsum([len(a) for a in whole], out=offsets[1:])
                groups.append((lib, (np.concatenate(whole), offsets)))
            out = splice(len(texts), groups)
        if self.bound.after_batch(sum(map(len, texts))):
            self._reset_cache()
        return out



def _cluster_table() -> np.ndarray:
    """Code points that join the character before them into one grapheme cluster, or are joined (combining marks,
    ZWJ/ZWNJ, Hangul jamo and syllables, regional indicators, emoji modifiers, tags, variation selectors, Arabic
    prepended marks): a bool per code point (1.1 MB; built once, ~20 ms, shared by forked workers)."""
    import unicodedata

    table = np.zeros(0x110000, dtype=bool)
    table[[c for c in range(0x300, 0x20000) if unicodedata.category(chr(c))[0] == "M"]] = True
    for a, b in ((0x200C, 0x200D), (0x1100, 0x11FF), (0xA960, 0xA97F), (0xAC00, 0xD7FF), (0x1F1E6, 0x1F1FF),
                 (0x1F3FB, 0x1F3FF), (0xE0020, 0xE007F), (0xE0100, 0xE01EF), (0xFF9E, 0xFF9F), (0x0600, 0x0605),
                 (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2), (0x0D4E, 0x0D4E)):
        table[a : b + 1] = True
    return table


_CLUSTERS: Optional[np.ndarray] = None


def _has_cluster(text: str) -> bool:
    """Whether the text may hold a grapheme cluster of several characters. The converted normalizer (the tokenizers
    library's Precompiled) maps such a cluster whole where sentencepiece maps characters by longest match, so they can
    differ there (2 of 36,687 web documents on nmt_nfkc: U+00A0 U+0301, whose mark the converted one dropped, and
    U+0387 U+0483): such texts take sentencepiece's normalizer. A table lookup over the code points (a regex with
    this class ran at ~3 MB/s)."""
    global _CLUSTERS
    if _CLUSTERS is None:
        _CLUSTERS = _cluster_table()
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return bool(_CLUSTERS[points].any())


def _flat(encode, texts: List[str]) -> Tuple[np.ndarray, np.ndarray]:
    """Each text through the backend's single-text ``encode`` (a uint32 numpy array, no Python object per token),
    joined. Not its ``encode_batch``: that returns an awkward array, whose import (~0.3 s per process) and per-batch
    assembly cost more than a call per document (web pages: ~230 calls per MB of text; measured equal or faster)."""
    if not texts:
        return np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64)
    arrays = list(map(encode, texts))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)), out=offsets[1:])
    return np.concatenate(arrays), offsets


def splice(n: int, groups) -> Tuple[np.ndarray, np.ndarray]:
    """One (flat, offsets) for texts 0..n-1 from groups of (their indices, their (flat, offsets))."""
    lengths = np.zeros(n, dtype=np.int64)
    for idx, (_, off) in groups:
        lengths[np.asarray(idx, dtype=np.int64)] = np.diff(off)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.zeros(int(offsets[-1]), dtype=np.uint32)
    for idx, (part, off) in groups:
        if not len(idx):
            continue
        # token j of the group's k-th text goes to offsets[idx[k]] + (j - off[k]): one scatter per group
        shift = offsets[np.asarray(idx, dtype=np.int64)] - off[:-1]
        flat[np.repeat(shift, np.diff(off)) + np.arange(off[-1], dtype=np.int64)] = part[: off[-1]]
    return flat, offsets

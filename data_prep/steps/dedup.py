"""Exact and near-duplicate (MinHash-LSH) dedup as sharded, global, deterministic passes over hash buckets.

A document's reference is ``ref = unit index << 32 | record ordinal in the unit`` (ordinals count every record the
reader yields, rejected ones included, so a ref means the same thing in every pass); smaller ref = earlier in the
sorted input listing. Keeper rule, both kinds: the smallest ref of its duplicate group wins, so the result does not
depend on which worker saw what first.

1. hash pass (per work unit): each document gets 128-bit keys (exact: one hash of its text; MinHash: one per LSH band,
   the band's index hashed in); the unit writes them as one array sorted by (bucket = key % buckets, key, ref), with
   the offsets of each bucket, so the owner of bucket b reads just its slice of every unit's file.
2. bucket pass (per bucket): the owner sorts its (key, ref) entries; within each group of equal keys the smallest ref
   is the keeper. Exact: the others are removed (stored as (removed, keeper) pairs, sorted). MinHash: each other member
   whose estimated Jaccard with the keeper (share of equal signature values, read from the units' signature files)
   reaches the threshold gives an edge (keeper, member): LSH finds candidates, the signatures confirm them, so pairs
   below the threshold that collide in a band are not removed.
3. cluster pass (MinHash only): union-find over the edges; each connected cluster keeps its smallest ref. Its input is
   the confirmed duplicate pairs only (size ~ duplicates, not the corpus), as in datatrove's MinhashDedupCluster.
The final filter pass of a unit reads the refs of its own unit range (searchsorted on the sorted arrays).

MinHash (``MinHasher``) is computed by compiled loops (kernels.py) over all of a document's shingles: each word hashed
once (xxh3-64), a shingle's 64-bit hash combined from its words' (position-weighted, then mixed), and each of the
num_perm permutations a multiply-add-shift hash, ((a * x + b) mod 2**64) >> 32 with a, b drawn from the seed:
strongly universal for 64-bit keys, no division, no Python per shingle. Until 2026-12 it was datasketch's
``MinHash`` (a SHA-1 per shingle in Python, 2.9 MB/s per core); the signatures differ, the duplicate sets on the
planted corpus do not (tests/data_prep/test_dp_curate.py). The bands x rows still come from datasketch's own LSH
parameter optimisation for the threshold (equal false-positive/negative weights). Band keys are xxh3-128: a colliding
pair is confirmed on the signatures in the bucket pass anyway; exact-dedup keys stay blake2b-128 (nothing confirms
those).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

KEY_DTYPE = np.dtype([("h", "<u8"), ("h2", "<u8"), ("ref", "<u8")])
PAIR_DTYPE = np.dtype([("ref", "<u8"), ("keeper", "<u8")])
MAX_ORDINAL = (1 << 32) - 1
_TWO_U64 = struct.Struct("<QQ")  # an xxh3-128 digest as two little-endian 64-bit halves (a band key)


def make_ref(unit: int, ordinal: int) -> int:
    if ordinal > MAX_ORDINAL:
        raise ValueError(f"more than {MAX_ORDINAL} records in one work unit: lower --shard-size")
    return unit << 32 | ordinal


def ref_unit(ref: int) -> int:
    return int(ref) >> 32


def ref_ordinal(ref: int) -> int:
    return int(ref) & MAX_ORDINAL


def ref_name(ref: int) -> str:
    """A reference as the removal log shows it: the unit's shard name and the record ordinal in it."""
    return f"shard_{ref_unit(ref):06d}#{ref_ordinal(ref)}"


class ExactDedupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    normalize: bool = Field(False, description="hash lower-cased text with whitespace runs collapsed, not raw text")


class MinHashDedupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(0.8, gt=0, lt=1, description="Jaccard similarity of word shingles at which a "
                                                           "document counts as a near duplicate")
    num_perm: int = Field(128, ge=16, le=1024, description="MinHash permutations (signature length)")
    shingle_words: int = Field(5, ge=1, le=50, description="words per shingle")
    lowercase: bool = True
    seed: int = 1
    bands: Optional[int] = Field(None, ge=1, description="LSH bands; default: datasketch's optimum for threshold")
    rows: Optional[int] = Field(None, ge=1, description="rows per band; give both bands and rows, or neither")

    @model_validator(mode="after")
    def _bands_rows(self):
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither (then they follow from threshold)")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands x rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        return self

    def band_layout(self) -> Tuple[int, int]:
        if self.bands is not None:
            return self.bands, self.rows
        return _optimal_layout(self.threshold, self.num_perm)


@functools.lru_cache(maxsize=None)
def _optimal_layout(threshold: float, num_perm: int) -> Tuple[int, int]:
    """datasketch's (bands, rows) for the threshold: ~1,400 numeric integrations (scipy quad) per call, and the
    passes ask for it several times per process (context, hashers, gates): computed once per process."""
    from datasketch.lsh import _optimal_param

    return _optimal_param(threshold, num_perm, 0.5, 0.5)


def _key128(data: bytes) -> Tuple[int, int]:
    d = hashlib.blake2b(data, digest_size=16).digest()
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")


class ExactHasher:
    def __init__(self, cfg: ExactDedupConfig):
        self.cfg = cfg

    def keys(self, text: str) -> List[Tuple[int, int]]:
        if self.cfg.normalize:
            text = " ".join(text.lower().split())
        return [_key128(text.encode("utf-8", "surrogatepass"))]


class MinHasher:
    """Signature and band keys of a document (see the module docstring for the hash family); the loops over
    shingles and permutations are compiled (kernels.py)."""

    def __init__(self, cfg: MinHashDedupConfig):
        import xxhash

        from data_prep.steps import kernels  # numba: imported only where a MinHash step runs

        self.cfg, self.k = cfg, kernels
        self.bands, self.rows = cfg.band_layout()
        self._word_hash = xxhash.xxh3_64_intdigest
        self._band_hash = xxhash.xxh3_128_digest
        self._band_prefixes = [b.to_bytes(2, "little") for b in range(self.bands)]
        rng = np.random.RandomState(cfg.seed)
        self.a = rng.randint(0, 2**63, size=cfg.num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd
        self.b = rng.randint(0, 2**63, size=cfg.num_perm, dtype=np.uint64)
        n = cfg.shingle_words
        # position weights of a shingle's words (odd, fixed): "a b c" and "c b a" hash apart
        self.weights = (np.random.RandomState(cfg.seed + 1).randint(0, 2**63, size=n, dtype=np.uint64)
                        * np.uint64(2) + np.uint64(1))

    def signature(self, text: str, words=None) -> np.ndarray:
        """num_perm values: for each permutation, the least ((a * x + b) mod 2**64) >> 32 over the shingles x.
        ``words``: the text's kernels.Words when a quality step scanned it already (its spans are reused; for
        lower-casing, only where the text is ASCII: str.lower of other text may change its characters' count)."""
        k, lower = self.k, self.cfg.lowercase
        if lower and not text.isascii():
            text, lower, words = text.lower(), False, None  # str.lower's own rules (final sigma, dotted I ...)
        if words is None:
            cps = k.code_points(text)
            words = k.Words(cps, *k.scan_words(cps, k.char_tables())[:2])
        sig, wh, long_words = k.word_signature(words.cps, words.starts, words.ends, lower, k.XXH3_SECRET,
                                               self.weights, self.cfg.shingle_words, self.a, self.b)
        if len(long_words):  # words over the kernel's 128 bytes: hashed by the xxhash library
            split = (text.lower() if lower else text).split()
            for i in long_words.tolist():
                wh[i] = self._word_hash(split[i].encode("utf-8", "surrogatepass"))
            sig = k.min_hashes(k.shingle_hashes(wh, self.weights, min(self.cfg.shingle_words, len(wh))), self.a,
                               self.b)
        return sig

    def band_keys(self, sig: np.ndarray) -> List[Tuple[int, int]]:
        """Per band b: xxh3-128 of b (2 bytes, little-endian) and the band's rows' bytes, as two 64-bit halves."""
        raw, h, pair = np.ascontiguousarray(sig).tobytes(), self._band_hash, _TWO_U64.unpack
        step = self.rows * sig.itemsize
        return [pair(h(prefix + raw[b * step:(b + 1) * step])) for b, prefix in enumerate(self._band_prefixes)]


def bucket_sorted(keys: List[Tuple[int, int, int]], buckets: int) -> Tuple[np.ndarray, np.ndarray]:
    """(h, h2, ref) triples -> the array sorted by (bucket, h, h2, ref) and the bucket offsets (buckets + 1)."""
    arr = np.array(keys, dtype=KEY_DTYPE) if keys else np.zeros(0, KEY_DTYPE)
    bucket = arr["h"] % np.uint64(buckets)
    order = np.lexsort((arr["ref"], arr["h2"], arr["h"], bucket))
    arr = arr[order]
    offsets = np.searchsorted(bucket[order], np.arange(buckets + 1, dtype=np.uint64)).astype(np.int64)
    return arr, offsets


def _groups(arr: np.ndarray) -> Iterable[Tuple[int, int]]:
    """[start, end) of each run of equal (h, h2) in an array sorted by (h, h2, ref), runs of 2+ only."""
    if len(arr) < 2:
        return []
    same = (arr["h"][1:] == arr["h"][:-1]) & (arr["h2"][1:] == arr["h2"][:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    ends = np.concatenate((starts[1:], [len(arr)]))
    keep = ends - starts > 1
    return zip(starts[keep].tolist(), ends[keep].tolist())


def sort_entries(arr: np.ndarray) -> np.ndarray:
    return arr[np.lexsort((arr["ref"], arr["h2"], arr["h"]))]


def exact_removed(arr: np.ndarray) -> np.ndarray:
    """(removed, keeper) pairs of one bucket's entries (sorted by sort_entries), sorted by removed ref."""
    out = []
    for s, e in _groups(arr):
        keeper = arr["ref"][s]
        out += [(int(r), int(keeper)) for r in arr["ref"][s + 1:e]]
    res = np.array(out, dtype=PAIR_DTYPE) if out else np.zeros(0, PAIR_DTYPE)
    return np.sort(res, order="ref")


def minhash_edges(arr: np.ndarray, signature_of, threshold: float) -> np.ndarray:
    """Confirmed (member, keeper) edges of one bucket's band entries: each group's smallest ref is its keeper; a
    member joins it when their signatures agree on at least ``threshold`` of their values."""
    out = set()
    for s, e in _groups(arr):
        keeper = int(arr["ref"][s])
        ks = signature_of(keeper)
        for r in arr["ref"][s + 1:e].tolist():
            if float(np.mean(signature_of(r) == ks)) >= threshold:
                out.add((r, keeper))
    res = np.array(sorted(out), dtype=PAIR_DTYPE) if out else np.zeros(0, PAIR_DTYPE)
    return res


def clusters_removed(edges: np.ndarray) -> np.ndarray:
    """Union-find over (member, keeper) edges: every cluster keeps its smallest ref; (removed, keeper) pairs sorted."""
    parent: Dict[int, int] = {}

    def find(x: int) -> int:
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    for a, b in zip(edges["ref"].tolist(), edges["keeper"].tolist()):
        ra, rb = find(a), find(b)
        if ra != rb:
            lo, hi = min(ra, rb), max(ra, rb)
            parent[hi] = lo  # the smaller ref is always the root: the root is the cluster's smallest ref
            parent.setdefault(lo, lo)
    out = [(x, find(x)) for x in parent if find(x) != x]
    res = np.array(out, dtype=PAIR_DTYPE) if out else np.zeros(0, PAIR_DTYPE)
    return np.sort(res, order="ref")


def unit_slice(pairs: np.ndarray, unit: int) -> np.ndarray:
    """The (removed, keeper) pairs whose removed ref lies in ``unit`` (pairs sorted by ref)."""
    lo = np.searchsorted(pairs["ref"], np.uint64(unit << 32))
    hi = np.searchsorted(pairs["ref"], np.uint64((unit + 1) << 32))
    return pairs[lo:hi]

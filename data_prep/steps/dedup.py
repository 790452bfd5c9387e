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

MinHash is datasketch's (``MinHash``: its permutations and 32-bit SHA-1 shingle hashing, seed fixed) and the bands x rows
come from datasketch's own LSH parameter optimisation for the threshold (equal false-positive/negative weights).
"""

from __future__ import annotations

import hashlib
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

KEY_DTYPE = np.dtype([("h", "<u8"), ("h2", "<u8"), ("ref", "<u8")])
PAIR_DTYPE = np.dtype([("ref", "<u8"), ("keeper", "<u8")])
MAX_ORDINAL = (1 << 32) - 1


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
        from datasketch.lsh import _optimal_param

        return _optimal_param(self.threshold, self.num_perm, 0.5, 0.5)


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
    """Signature and band keys of a document (one datasketch MinHash reused: its permutations are made once)."""

    def __init__(self, cfg: MinHashDedupConfig):
        from datasketch import MinHash

        self.cfg = cfg
        self.bands, self.rows = cfg.band_layout()
        self._mh = MinHash(num_perm=cfg.num_perm, seed=cfg.seed)

    def shingles(self, text: str) -> set:
        words = (text.lower() if self.cfg.lowercase else text).split()
        n = self.cfg.shingle_words
        if len(words) <= n:
            return {" ".join(words).encode("utf-8", "surrogatepass")}
        return {" ".join(words[i:i + n]).encode("utf-8", "surrogatepass") for i in range(len(words) - n + 1)}

    def signature(self, text: str) -> np.ndarray:
        self._mh.clear()
        self._mh.update_batch(self.shingles(text))
        return self._mh.hashvalues.astype(np.uint32)

    def band_keys(self, sig: np.ndarray) -> List[Tuple[int, int]]:
        r = self.rows
        return [_key128(b.to_bytes(2, "little") + sig[b * r:(b + 1) * r].tobytes()) for b in range(self.bands)]


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

"""Many shards as one megatron-core low-level dataset: start-up in seconds over 10,000+ shards, memory flat.

megatron-core blends one GPTDataset per prefix: per shard it opens the .idx and .bin, builds and caches three index
files per split and keeps the arrays, so 10,000 shards cost minutes, ~80,000 cache files and 20,000 memory maps in
every rank. A data_prep manifest weighs its shards by their tokens, which is what sampling their concatenation does;
so the shards of one source are one ``ShardSet``:
- its index (every sequence's length and byte offset, each shard's first sequence, the shards' dtype) is built once
  from the shards' .idx files into three .npy files in the cache, keyed on the shards' identity; the first rank of a
  node to need it builds it under a lock, the others wait and memory-map it (so once per node when the cache is
  node-local, once in all when it is shared and rank 0 goes first);
- a shard's .bin is memory-mapped on first read, at most ``MAX_OPEN`` at a time (100,000 maps would pass the
  kernel's default vm.max_map_count of 65,530);
- it offers what GPTDataset asks of an IndexedDataset: ``sequence_lengths``, ``get``, ``len``.
Samples are those of one GPTDataset over the shards merged into one (tested against `data_prep merge`).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import numpy

from data_prep.write.shards import CODE_DTYPES, read_index_arrays
from recipes.train.data_cache import check_npy

MAX_OPEN = 1024
_FILES = ("lengths", "pointers", "starts")


def set_path(cache_dir: Path, prefixes: list[str], identity: str) -> Path:
    """Where the index of these shards lives: named by their list and identity."""
    key = hashlib.sha256(("\n".join(prefixes) + "\n" + identity).encode()).hexdigest()[:20]
    return cache_dir / f"shardset-{key}"


def build_index(path: Path, prefixes: list[str]) -> None:
    """Write the index of ``prefixes`` at ``path`` (a directory), unless a complete one is there; one builder at a
    time per file system (an flock), the others wait for it and find it done."""
    path.mkdir(parents=True, exist_ok=True)
    with open(path.parent / (path.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _recorded_prefixes(path) == prefixes:
            return  # (a shards.json naming other files, planted or stale, is rebuilt: the manifest names the shards)
        dtype, counts = None, []
        lengths_parts, pointers_parts = [], []
        for p in prefixes:
            d, lengths, pointers, _ = read_index_arrays(p + ".idx")
            if dtype is not None and numpy.dtype(d) != dtype:
                raise ValueError(f"{p}: token dtype {numpy.dtype(d).name} differs from the other shards' "
                                 f"{dtype.name}; tokenize every shard with one tokenizer")
            dtype = numpy.dtype(d)
            counts.append(len(lengths))
            lengths_parts.append(numpy.array(lengths))
            pointers_parts.append(numpy.array(pointers))
        starts = numpy.zeros(len(prefixes) + 1, dtype=numpy.int64)
        numpy.cumsum(counts, out=starts[1:])
        arrays = {"lengths": numpy.concatenate(lengths_parts).astype(numpy.int32, copy=False),
                  "pointers": numpy.concatenate(pointers_parts).astype(numpy.int64, copy=False), "starts": starts}
        for name, arr in arrays.items():
            _atomic_save(path / f"{name}.npy", arr)
        code = next(c for c, t in CODE_DTYPES.items() if numpy.dtype(t) == dtype)
        _atomic_bytes(path / "shards.json", json.dumps({"prefixes": prefixes, "dtype_code": code}).encode())


def _recorded_prefixes(path: Path) -> list[str] | None:
    try:
        return json.loads((path / "shards.json").read_text()).get("prefixes")
    except (OSError, ValueError, AttributeError):
        return None


def _atomic_save(dest: Path, arr: numpy.ndarray) -> None:
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        numpy.save(f, arr, allow_pickle=False)
    os.replace(tmp, dest)


def _atomic_bytes(dest: Path, data: bytes) -> None:
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, dest)


class ShardSet:
    """The concatenation of a list of shards, read through a cached index (``build_index``). `prefixes` are the
    manifest's: the index must be theirs (the cache says which files it indexes, it never chooses them)."""

    def __init__(self, path: Path, prefixes: list[str]):
        meta = json.loads((path / "shards.json").read_text())
        if meta.get("prefixes") != list(prefixes):
            raise ValueError(f"{path}: this cached index names other shards than the manifest's; delete {path} and "
                             "rerun (keep data caches writable only by you)")
        self.path_prefix = str(path)
        self.prefixes: list[str] = list(prefixes)
        self.dtype = numpy.dtype(CODE_DTYPES[int(meta["dtype_code"])])
        arrays = {}
        for name in _FILES:
            f = path / f"{name}.npy"
            why = check_npy(f, ndim=1)
            if why:
                raise ValueError(f"{f}: {why}; delete {path} and rerun")
            arrays[name] = numpy.load(f, mmap_mode="r", allow_pickle=False)
        self.sequence_lengths = arrays["lengths"]
        self.pointers = arrays["pointers"]
        self.starts = arrays["starts"]
        if len(self.starts) != len(self.prefixes) + 1 or self.starts[-1] != len(self.sequence_lengths):
            raise ValueError(f"{path}: its index does not match its shard list; delete {path} and rerun")
        self._open: "OrderedDict[int, numpy.memmap]" = OrderedDict()

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def _bin(self, shard: int) -> numpy.memmap:
        mm = self._open.get(shard)
        if mm is None:
            if len(self._open) >= MAX_OPEN:
                self._open.popitem(last=False)
            mm = numpy.memmap(self.prefixes[shard] + ".bin", dtype=self.dtype, mode="r")
            self._open[shard] = mm
        else:
            self._open.move_to_end(shard)
        return mm

    def get(self, idx: int, offset: int = 0, length: Optional[int] = None) -> numpy.ndarray:
        """Tokens of sequence ``idx`` from ``offset``, ``length`` of them (all the rest when None)."""
        shard = int(numpy.searchsorted(self.starts, idx, side="right")) - 1
        n = int(self.sequence_lengths[idx])
        length = n - offset if length is None else length
        first = int(self.pointers[idx]) // self.dtype.itemsize + offset
        return numpy.array(self._bin(shard)[first : first + length])

    def __getstate__(self):  # DataLoader workers re-open their own maps
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()
        return state


"""verify DIR: every shard opened by megatron-core's IndexedDataset and checked against the manifest.

Checks per shard: header and version, dtype = manifest dtype, sequence/document counts, lengths vs .bin size,
pointers = cumulative lengths (int64), document index monotone from 0 to the sequence count, token ids < vocab size,
sha256 of .bin and .idx. Returns a list of problems, each naming the shard.
"""

from __future__ import annotations

import os
from typing import List

import numpy as np

from data_prep import io
from data_prep.write.manifest import read_manifest
from data_prep.write.shards import expected_idx_bytes, read_header


def verify_shard(out_dir: str, shard: dict, dtype: str, vocab_size: int, checksums: bool = True) -> List[str]:
    from data_prep.write.shards import indexed_dataset_class

    IndexedDataset = indexed_dataset_class()
    name = shard["prefix"]
    prefix = os.path.join(out_dir, name)
    problems = []
    for suffix in (".bin", ".idx"):
        if not os.path.exists(prefix + suffix):
            return [f"{name}: {prefix + suffix} is missing"]
    try:
        head = read_header(prefix + ".idx")
    except ValueError as e:
        return [f"{name}: {e}"]
    if head["dtype"].name != dtype:
        problems.append(f"{name}: dtype {head['dtype'].name} != manifest {dtype}")
    if head["sequences"] != shard["sequences"] or head["document_count"] != shard["documents"] + 1:
        problems.append(f"{name}: header counts {head['sequences']} sequences / {head['document_count'] - 1} documents "
                        f"!= manifest {shard['sequences']} / {shard['documents']}")
    idx_size = os.path.getsize(prefix + ".idx")
    if idx_size != expected_idx_bytes(head["sequences"], head["document_count"] - 1):
        return problems + [f"{name}: .idx is {idx_size} bytes, expected "
                           f"{expected_idx_bytes(head['sequences'], head['document_count'] - 1)} (truncated or padded)"]
    bin_size = os.path.getsize(prefix + ".bin")
    if bin_size != shard["bytes"]:
        problems.append(f"{name}: .bin is {bin_size} bytes, manifest says {shard['bytes']}")
    if bin_size == 0:
        return problems + [f"{name}: .bin is empty"]
    try:
        ds = IndexedDataset(prefix)
    except Exception as e:  # megatron-core asserts on inconsistent indexes
        return problems + [f"{name}: megatron-core IndexedDataset cannot open it ({type(e).__name__}: {e})"]
    lengths = ds.index.sequence_lengths.astype(np.int64)
    pointers = ds.index.sequence_pointers
    itemsize = np.dtype(dtype).itemsize
    expect_ptr = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * itemsize
    if len(lengths) and not np.array_equal(pointers, expect_ptr):
        problems.append(f"{name}: sequence pointers are not the cumulative lengths")
    if int(lengths.sum()) * itemsize != bin_size:
        problems.append(f"{name}: lengths sum to {int(lengths.sum())} tokens but .bin holds {bin_size // itemsize}")
    if int(lengths.sum()) != shard["tokens"]:
        problems.append(f"{name}: {int(lengths.sum())} tokens != manifest {shard['tokens']}")
    docs = ds.index.document_indices
    if docs[0] != 0 or docs[-1] != len(lengths) or np.any(np.diff(docs) <= 0):
        problems.append(f"{name}: document index is not increasing from 0 to the sequence count")
    if (lengths <= 0).any():
        problems.append(f"{name}: empty sequences present")
    tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
    step = 1 << 24
    for lo in range(0, len(tokens), step):
        if int(tokens[lo : lo + step].max(initial=0)) >= vocab_size:
            problems.append(f"{name}: token ids >= vocab size {vocab_size}")
            break
    del tokens, ds
    if checksums:
        if io.file_sha256(prefix + ".bin") != shard["sha256_bin"]:
            problems.append(f"{name}: sha256 of .bin does not match the manifest (corrupted data)")
        if io.file_sha256(prefix + ".idx") != shard["sha256_idx"]:
            problems.append(f"{name}: sha256 of .idx does not match the manifest")
    return problems


def verify(out_dir: str, checksums: bool = True) -> List[str]:
    m = read_manifest(out_dir)
    problems = []
    if m.get("format") != "megatron-mmidx":
        problems.append(f"{out_dir}/manifest.json: format {m.get('format')!r} is not megatron-mmidx")
    t = m["totals"]
    removed = sum(sum(r.values()) for r in t.get("removed", {}).values())  # curation (--steps) removals
    if t["input_records"] != t["documents"] + sum(t["rejected"].values()) + removed:
        problems.append("manifest does not balance: input_records != documents + rejected + removed")
    for shard in m["shards"]:
        problems += verify_shard(out_dir, shard, m["dtype"], m["tokenizer"]["vocab_size"], checksums)
    return problems

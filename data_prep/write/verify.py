"""verify DIR: every shard opened by megatron-core's IndexedDataset and checked against the manifest; and the
integrity checks every reader of shards runs before trusting them.

Checks per shard (`verify`): header and version, dtype = manifest dtype, sequence/document counts, lengths vs .bin
size, pointers = cumulative lengths (int64), document index monotone from 0 to the sequence count, token ids < vocab
size, sha256 of .bin and .idx. Returns a list of problems, each naming the shard.

Before shards are read (`check_recorded` / `verify_recorded`: training's data loader, `merge`), against the sha256
the manifest recorded: by default the .idx (small: ~1% of the .bin for 1,000-token documents, and read whole by
every reader anyway) and the .bin's size implied by that index (a stat); with ``full`` (``data.verify: full``, or
`data_prep verify`) the .bin's sha256 too. The costs, measured: docs/data_prep.md ("Integrity").
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable, List, Optional, Tuple

import numpy as np

from data_prep import io
from data_prep.write.manifest import read_manifest
from data_prep.write.shards import expected_idx_bytes, read_header, read_index_arrays

REBUILD = ("restore it from a good copy, or rebuild it (rerun the tokenize that wrote it: complete units are kept, "
           "this one is redone once its marker is removed); `python -m data_prep verify DIR` lists every damaged "
           "shard")


class ShardIntegrityError(ValueError):
    """A shard file whose bytes do not match what its manifest recorded: one line naming the file and the fix."""


def check_recorded(prefix: str, sha256_idx: Optional[str], sha256_bin: Optional[str] = None,
                   full: bool = False) -> List[str]:
    """Problems of one shard against the sha256 its manifest recorded ([] when it matches; a hash not recorded is
    not checked): the .idx's sha256 and the .bin size its index implies; with ``full`` also the .bin's sha256."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    for path in (idx, bin_):
        if not os.path.isfile(path):
            return [f"{path} is missing; {REBUILD}"]
    if sha256_idx and io.file_sha256(idx) != sha256_idx:
        return [f"{idx}: sha256 does not match its manifest ({sha256_idx[:12]}...): the index was damaged or "
                f"replaced after the manifest was written; {REBUILD}"]
    try:
        dtype, lengths, _, _ = read_index_arrays(idx)
    except ValueError as e:
        return [f"{e}; {REBUILD}"]
    want = int(lengths.sum(dtype=np.int64)) * np.dtype(dtype).itemsize
    del lengths
    have = os.path.getsize(bin_)
    if have != want:
        return [f"{bin_} is {have:,} bytes but its index says {want:,} (truncated or padded); {REBUILD}"]
    if full and sha256_bin and io.file_sha256(bin_) != sha256_bin:
        return [f"{bin_}: sha256 does not match its manifest ({sha256_bin[:12]}...): the tokens were damaged "
                f"(bit rot, a partial copy); {REBUILD}"]
    return []


def verify_recorded(prefixes: Iterable[str], recorded: dict, full: bool = False,
                    share: Tuple[int, int] = (0, 1)) -> None:
    """Check the shards ``prefixes`` against ``recorded`` (prefix -> (sha256 of .idx, sha256 of .bin), as
    recipes.train.data.Blend.recorded holds them); only every ``share[1]``-th from ``share[0]`` (a rank's share of
    the work). Raises ShardIntegrityError naming the first damaged file (and how many more)."""
    mine = [p for i, p in enumerate(prefixes) if i % share[1] == share[0] and p in recorded]
    problems: List[str] = []
    for p in mine:
        sha_idx, sha_bin = recorded[p]
        problems += check_recorded(p, sha_idx, sha_bin, full)
    if problems:
        more = f" ({len(problems) - 1} more shard(s) damaged)" if len(problems) > 1 else ""
        raise ShardIntegrityError(problems[0] + more)



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
    if not isinstance(m.get("dtype"), str) or not isinstance(m["tokenizer"].get("vocab_size"), int):
        return [f"{out_dir}/manifest.json: no dtype or tokenizer.vocab_size (not as data_prep writes it); rewrite "
                "the manifest: rerun the tokenize that wrote it with the same arguments"]
    problems = []
    if m.get("format") != "megatron-mmidx":
        problems.append(f"{out_dir}/manifest.json: format {m.get('format')!r} is not megatron-mmidx")
    t = m["totals"]
    removed = sum(sum(r.values()) for r in t.get("removed", {}).values())  # curation (--steps) removals
    if t["input_records"] != t["documents"] + sum(t["rejected"].values()) + removed:
        problems.append("manifest does not balance: input_records != documents + rejected + removed")
    for i, shard in enumerate(m["shards"]):
        try:
            problems += verify_shard(out_dir, shard, m["dtype"], m["tokenizer"]["vocab_size"], checksums)
        except (KeyError, TypeError) as e:  # an entry edited by hand or cut short
            problems.append(f"{out_dir}/manifest.json: shard entry {i} lacks {e} (not as data_prep writes it); "
                            "rewrite the manifest: rerun the tokenize that wrote it with the same arguments")
    return problems

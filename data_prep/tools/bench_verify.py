"""What each integrity check of shards costs, side by side on the same shards in one run:

    python -m data_prep.tools.bench_verify [OUT] --mb 512 --shards 8 --doc-tokens 1000

Writes ``--shards`` shards of random tokens (``--mb`` MB of .bin in all, documents of ~``--doc-tokens`` tokens,
uint16) and a manifest, then times, each over every shard: a plain read of the .idx and .bin files (the I/O every
reader pays once), the default check (sha256 of every .idx + the .bin size it implies: what training and `merge` run
before reading), the full check (+ sha256 of every .bin: `data.verify: full`), `data_prep verify` without and with
checksums, and `merge` (which hashes each source .bin while copying it) beside the same merge unchecked. Prints the
best of ``--repeat`` interleaved tries: seconds, seconds per GB and MB/s of shard bytes, and the ratio to the plain
read; the files were just written, so they are read from the page cache (the CPU cost, not the disk's).
OUT (default: a temporary directory) is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np


def write_shards(root: str, mb: float, shards: int, doc_tokens: int, seed: int = 0) -> int:
    """``shards`` shards of ~``mb`` MB of .bin in all and their manifest; returns the bytes written (.bin + .idx)."""
    from data_prep.write.shards import ShardWriter

    rng = np.random.default_rng(seed)
    per_shard = int(mb * 1e6 / 2 / shards)  # uint16 tokens
    entries, total = [], 0
    for i in range(shards):
        lengths = rng.integers(doc_tokens // 2, doc_tokens * 3 // 2, size=per_shard // doc_tokens + 1)
        lengths = lengths[np.cumsum(lengths) <= per_shard] if lengths.sum() > per_shard else lengths
        tokens = rng.integers(0, 32000, size=int(lengths.sum()), dtype=np.uint16)
        w = ShardWriter(os.path.join(root, f"shard_{i:06d}"), np.uint16, fsync=False)
        w.add_documents(tokens, lengths.astype(np.int64))
        st = w.finalize()
        total += st["bytes"] + st["idx_bytes"]
        entries.append({"prefix": f"shard_{i:06d}", **st, "input_records": st["documents"], "inputs": [],
                        "rejected": {}})
    manifest = {"format": "megatron-mmidx", "version": 1, "dtype": "uint16", "settings": {},
                "tokenizer": {"type": "bench", "path": "", "vocab_size": 32000, "eod_id": 0, "sha256": "bench"},
                "shards": entries, "empty_units": [], "blend": [],
                "totals": {"input_records": sum(e["documents"] for e in entries),
                           "documents": sum(e["documents"] for e in entries), "rejected": {},
                           "tokens": sum(e["tokens"] for e in entries), "shards": shards,
                           "bytes": sum(e["bytes"] for e in entries)}}
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return total


def _plain_read(root: str, entries: list) -> None:
    for e in entries:
        for suffix in (".idx", ".bin"):
            with open(os.path.join(root, e["prefix"] + suffix), "rb", buffering=0) as f:
                while f.read(1 << 24):
                    pass


def _unchecked_merge(root: str) -> None:
    """The merge as it was before its sources were checked: the reference for what the check adds."""
    from unittest import mock

    from data_prep.write import merge as merge_mod
    from data_prep.write.shards import append_shard

    with mock.patch.object(merge_mod, "_append_checked", lambda w, prefix, shard: append_shard(w, prefix)):
        merge_mod.merge([root], os.path.join(root, "merged"), 1 << 40, quiet=True, overwrite=True)


def bench(root: str, mb: float, shards: int, doc_tokens: int, repeat: int = 3) -> list:
    from data_prep.write.merge import merge
    from data_prep.write.verify import check_recorded, verify

    nbytes = write_shards(root, mb, shards, doc_tokens)
    entries = json.load(open(os.path.join(root, "manifest.json")))["shards"]
    recorded = [(os.path.join(root, e["prefix"]), e["sha256_idx"], e["sha256_bin"]) for e in entries]
    cases = [
        ("plain read of .idx + .bin", lambda: _plain_read(root, entries)),
        ("default check (.idx sha256 + .bin size)", lambda: [check_recorded(p, i) for p, i, _ in recorded]),
        ("full check (+ .bin sha256)", lambda: [check_recorded(p, i, b, full=True) for p, i, b in recorded]),
        ("data_prep verify --no-checksums", lambda: verify(root, checksums=False)),
        ("data_prep verify", lambda: verify(root)),
        ("data_prep merge (checks its sources)", lambda: merge([root], os.path.join(root, "merged"), 1 << 40,
                                                               quiet=True, overwrite=True)),
        ("  the same merge, sources unchecked", lambda: _unchecked_merge(root)),
    ]
    _plain_read(root, entries)  # warm the page cache for every case alike
    from data_prep.write.shards import indexed_dataset_class

    indexed_dataset_class()  # megatron-core's import (seconds) is not a check's cost
    best = {name: float("inf") for name, _ in cases}
    for _ in range(repeat):  # interleaved, the best of each: a busy shared machine slows one try, not a case
        for name, fn in cases:
            t = time.perf_counter()
            out = fn()
            if isinstance(out, list) and any(out):
                raise AssertionError(f"{name}: {out}")
            best[name] = min(best[name], time.perf_counter() - t)
    rows = list(best.items())
    base = rows[0][1]
    idx_bytes = sum(e["idx_bytes"] for e in entries)
    print(f"{shards} shards, {nbytes / 1e6:.0f} MB (.idx {idx_bytes / 1e6:.1f} MB = {idx_bytes / nbytes:.2%}), "
          f"documents of ~{doc_tokens} tokens; page cache warm; {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'case':42s} {'seconds':>8s} {'s per GB':>9s} {'MB/s':>8s} {'x plain read':>13s}")
    for name, s in rows:
        print(f"{name:42s} {s:8.2f} {s / (nbytes / 1e9):9.2f} {nbytes / 1e6 / s:8.0f} {s / base:13.2f}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data_prep.tools.bench_verify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--mb", type=float, default=512.0, help="MB of .bin in all")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--doc-tokens", type=int, default=1000, help="mean document length in tokens")
    ap.add_argument("--repeat", type=int, default=3, help="tries per case (interleaved); the best is shown")
    a = ap.parse_args(argv)
    root = a.out or tempfile.mkdtemp(prefix="bench_verify-")
    os.makedirs(root, exist_ok=True)
    try:
        bench(root, a.mb, a.shards, a.doc_tokens, a.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""stats / inspect: documents, tokens, a length histogram and a few documents decoded back to text."""

from __future__ import annotations

import os

import numpy as np

from data_prep.write.manifest import read_manifest
from data_prep.write.verify import ShardIntegrityError, check_recorded


def summarize(out_dir: str, decode: int = 2, chars: int = 300) -> str:
    from data_prep.write.shards import indexed_dataset_class

    IndexedDataset = indexed_dataset_class()
    m = read_manifest(out_dir)
    t = m["totals"]
    lines = [
        f"{out_dir}: {t['shards']} shards, {t['documents']:,} documents, {t['tokens']:,} tokens, "
        f"{t['bytes'] / 1e6:.1f} MB on disk, dtype {m['dtype']}",
        f"tokenizer: {m['tokenizer']['type']} {m['tokenizer']['path']} (vocab {m['tokenizer']['vocab_size']}, "
        f"eod {m['tokenizer']['eod_id']})",
        f"input records: {t['input_records']:,}; rejected: {t['rejected'] or 'none'}",
    ]
    lengths = []
    for sh in m["shards"]:
        damaged = check_recorded(os.path.join(out_dir, sh["prefix"]), sh.get("sha256_idx"))  # cheap: the .idx
        if damaged:
            raise ShardIntegrityError(damaged[0])
        ds = IndexedDataset(os.path.join(out_dir, sh["prefix"]))
        lengths.append(np.array(ds.index.sequence_lengths))  # copy: the mmap closes with ds
    if lengths:
        lens = np.concatenate(lengths)
        lines.append(f"sequence length: min {lens.min()}, median {int(np.median(lens))}, mean {lens.mean():.0f}, "
                     f"max {lens.max()}")
        edges = [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 2**31]
        hist, _ = np.histogram(lens, bins=edges)
        top = max(hist.max(), 1)
        for lo, hi, n in zip(edges[:-1], edges[1:], hist):
            label = f"{lo}-{hi - 1}" if hi < 2**31 else f">={lo}"
            lines.append(f"  {label:>12} {n:8d} {'#' * int(40 * n / top)}")
    if decode and m["shards"]:
        from data_prep.steps.tokenizers import load_tokenizer

        tok = load_tokenizer(m["tokenizer"]["path"], m["tokenizer"]["eod_id"])
        ds = IndexedDataset(os.path.join(out_dir, m["shards"][0]["prefix"]))
        for i in range(min(decode, len(ds))):
            text = tok.decode(ds[i])
            lines.append(f"--- document {i} of {m['shards'][0]['prefix']} ({len(ds[i])} tokens):")
            lines.append(text[:chars] + ("..." if len(text) > chars else ""))
    return "\n".join(lines)

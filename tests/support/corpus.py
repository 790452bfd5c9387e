"""Real-text test corpora. Shards: UTF-8 bytes of Python's own standard-library sources, one document per file, written with
megatron-core's IndexedDatasetBuilder (the reader of record) and described by a data_prep-style manifest.json.
Byte-level ids 0..255, end-of-document 256 (vocab 257). Documents go to the builder as numpy arrays: given a torch
tensor it converts through numpy 2's deprecated __array__ fallback, one DeprecationWarning per document."""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np

EOD = 256
VOCAB = 257


def stdlib_documents(max_bytes: int) -> list[bytes]:
    """The running Python's standard-library sources in name order, one document per file, about max_bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    for p in sorted(root.glob("*.py")):
        data = p.read_bytes()
        docs.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return docs


def stdlib_texts(max_bytes: int) -> list[str]:
    """The same documents as text (undecodable bytes replaced)."""
    return [d.decode("utf-8", errors="replace") for d in stdlib_documents(max_bytes)]


def write_corpus(out_dir: Path, shards: int = 2, max_bytes: int = 600_000, doc_bytes: int | None = None) -> Path:
    """Write `shards` .bin/.idx pairs + manifest.json under out_dir; returns the manifest path. `doc_bytes` cuts the
    files into documents of at most that many bytes (packed samples then hold several documents)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    out_dir.mkdir(parents=True, exist_ok=True)
    docs = stdlib_documents(max_bytes)
    if doc_bytes:
        docs = [d[i:i + doc_bytes] for d in docs for i in range(0, len(d), doc_bytes)]
    entries = []
    for s in range(shards):
        prefix = f"shard_{s:03d}"
        builder = IndexedDatasetBuilder(str(out_dir / f"{prefix}.bin"), dtype=np.uint16)
        tokens = 0
        for d in docs[s::shards]:
            ids = np.frombuffer(d, dtype=np.uint8).astype(np.uint16)
            ids = np.append(ids, np.uint16(EOD))
            builder.add_document(ids, [len(ids)])
            tokens += len(ids)
        builder.finalize(str(out_dir / f"{prefix}.idx"))
        entries.append({"prefix": prefix, "tokens": tokens})
    manifest = {
        "tokenizer": {"vocab_size": VOCAB, "eod_id": EOD, "pad_id": None, "type": "bytes", "path": None},
        "dtype": "uint16",
        "shards": entries,
        "blend": [x for e in entries for x in (e["tokens"], e["prefix"])],
    }
    path = out_dir / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1))
    return path


def write_digit_corpus(out_dir: Path, docs: int = 200) -> Path:
    """A second corpus for data-stage tests: byte-level documents of ASCII digits only (tokens 48-57 + EOD), so a
    sample says which corpus it came from. Same tokenizer record as `write_corpus`; returns the manifest path."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    out_dir.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(str(out_dir / "shard_000.bin"), dtype=np.uint16)
    tokens = 0
    for i in range(docs):
        ids = np.array([48 + (i * 7 + j) % 10 for j in range(50 + i % 40)] + [EOD], dtype=np.int64)
        builder.add_document(ids, [len(ids)])
        tokens += len(ids)
    builder.finalize(str(out_dir / "shard_000.idx"))
    manifest = {"tokenizer": {"vocab_size": VOCAB, "eod_id": EOD, "pad_id": None, "type": "bytes", "path": None},
                "dtype": "uint16", "shards": [{"prefix": "shard_000", "tokens": tokens}], "blend": [tokens, "shard_000"]}
    path = out_dir / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1))
    return path

"""Megatron MMIDIDX shards (.bin + .idx), written with bounded memory, made visible atomically.

Format (megatron/core/datasets/indexed_dataset.py, the reader of record): .idx = b"MMIDIDX\\x00\\x00", version <Q 1,
dtype code <B, sequence count <Q, document count <Q (= documents + 1), int32 sequence lengths, int64 byte pointers
into .bin, int64 document indices (0, then the sequence count at the end of each document). .bin = the tokens.

The writer streams tokens to ``<prefix>.bin.tmp`` and the per-sequence lengths / document ends to side files, so its
memory is the flush buffer, not the shard. ``finalize`` writes the index from those side files in chunks, fsyncs both
files and renames them into place (bin first, idx last), returning sizes and sha256 checksums.
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import List

import numpy as np

from data_prep import io

INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
               np.dtype(np.int64): 5, np.dtype(np.float64): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 8}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}
HEADER_BYTES = 9 + 8 + 1 + 8 + 8
CHUNK = 1 << 20  # entries per chunk when copying index arrays


def tmp_paths(prefix: str) -> List[str]:
    return [prefix + s for s in (".bin.tmp", ".idx.tmp", ".len.tmp", ".doc.tmp")]


class ShardWriter:
    def __init__(self, prefix: str, dtype, flush_tokens: int = 1 << 22, fsync: bool = True):
        self.prefix = prefix
        self.fsync = fsync
        self.dtype = np.dtype(dtype)
        self.flush_tokens = flush_tokens
        for p in tmp_paths(prefix):  # leftovers of a killed run
            if os.path.exists(p):
                os.remove(p)
        self.bin = io.open_write(prefix + ".bin.tmp")
        self.lens = io.open_write(prefix + ".len.tmp")
        self.docs = io.open_write(prefix + ".doc.tmp")
        self.bin_sha = hashlib.sha256()
        self.tok_buf: List[np.ndarray] = []
        self.len_buf: List[int] = []
        self.doc_buf: List[int] = []
        self.buffered = 0
        self.sequences = 0
        self.documents = 0
        self.tokens = 0

    def add_document(self, sequences: List[np.ndarray]) -> None:
        """One document made of one or more sequences (several when a long document is split)."""
        for seq in sequences:
            self.tok_buf.append(seq)
            self.len_buf.append(len(seq))
            self.buffered += len(seq)
            self.tokens += len(seq)
            self.sequences += 1
        self.documents += 1
        self.doc_buf.append(self.sequences)
        if self.buffered >= self.flush_tokens or len(self.len_buf) >= CHUNK:
            self.flush()

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Many documents of one sequence each: ``tokens`` all of them one after another, ``lengths`` each one's."""
        n = len(lengths)
        self.tok_buf.append(tokens)
        self.len_buf.extend(lengths.tolist())
        self.doc_buf.extend(range(self.sequences + 1, self.sequences + n + 1))
        self.buffered += len(tokens)
        self.tokens += len(tokens)
        self.sequences += n
        self.documents += n
        if self.buffered >= self.flush_tokens or len(self.len_buf) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        for arr in self.tok_buf:  # written and hashed as they are: no joined copy, no bytes copy
            data = memoryview(np.ascontiguousarray(arr, dtype=self.dtype)).cast("B")
            self.bin.write(data)
            self.bin_sha.update(data)
        if self.len_buf:
            self.lens.write(np.asarray(self.len_buf, dtype=np.int32).tobytes())
        if self.doc_buf:
            self.docs.write(np.asarray(self.doc_buf, dtype=np.int64).tobytes())
        self.tok_buf, self.len_buf, self.doc_buf, self.buffered = [], [], [], 0

    def _write_index(self, path: str) -> str:
        sha = hashlib.sha256()
        itemsize = self.dtype.itemsize
        with io.open_write(path) as out:
            def put(b: bytes):
                out.write(b)
                sha.update(b)

            put(INDEX_HEADER)
            put(struct.pack("<Q", 1))
            put(struct.pack("<B", DTYPE_CODES[self.dtype]))
            put(struct.pack("<Q", self.sequences))
            put(struct.pack("<Q", self.documents + 1))
            with open(self.prefix + ".len.tmp", "rb") as f:
                for block in iter(lambda: f.read(4 * CHUNK), b""):
                    put(block)
            with open(self.prefix + ".len.tmp", "rb") as f:
                offset = 0
                for block in iter(lambda: f.read(4 * CHUNK), b""):
                    lengths = np.frombuffer(block, dtype=np.int32).astype(np.int64) * itemsize
                    ends = np.cumsum(lengths) + offset
                    put((ends - lengths).tobytes())  # int64 pointers: shards past 2^31 tokens work
                    offset = int(ends[-1])
            put(np.zeros(1, dtype=np.int64).tobytes())
            with open(self.prefix + ".doc.tmp", "rb") as f:
                for block in iter(lambda: f.read(8 * CHUNK), b""):
                    put(block)
            io.fsync_file(out, self.fsync)
        return sha.hexdigest()

    def finalize(self) -> dict:
        """Write the index and rename both files into place. On failure (a full disk) the caller calls ``abort``,
        which removes the temporary files."""
        self.flush()
        for f in (self.bin, self.lens, self.docs):
            io.fsync_file(f, self.fsync)
            f.close()
        idx_sha = self._write_index(self.prefix + ".idx.tmp")
        nbytes = os.path.getsize(self.prefix + ".bin.tmp")
        idx_bytes = os.path.getsize(self.prefix + ".idx.tmp")
        os.replace(self.prefix + ".bin.tmp", self.prefix + ".bin")
        os.replace(self.prefix + ".idx.tmp", self.prefix + ".idx")
        for p in (self.prefix + ".len.tmp", self.prefix + ".doc.tmp"):
            os.remove(p)
        if self.fsync:
            io.fsync_dir(os.path.dirname(self.prefix) or ".")
        return {
            "documents": self.documents,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "bytes": nbytes,
            "idx_bytes": idx_bytes,
            "sha256_bin": self.bin_sha.hexdigest(),
            "sha256_idx": idx_sha,
        }

    def abort(self) -> None:
        """Close and remove the temporary files; safe to call after a failed ``finalize`` (closing a file whose
        buffered data cannot be written on a full disk raises, and is ignored here)."""
        for f in (self.bin, self.lens, self.docs):
            try:
                f.close()
            except OSError:
                pass
        for p in tmp_paths(self.prefix):
            io.remove(p)


def read_header(idx_path: str) -> dict:
    """Header fields of an .idx; raises ValueError naming the file when it is not a valid MMIDIDX index."""
    with io.open_read(idx_path, block_size=4096) as f:  # on object storage: a ranged GET of the header only
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:9] != INDEX_HEADER:
        raise ValueError(f"{idx_path}: not an MMIDIDX index (bad or short header)")
    version = struct.unpack("<Q", head[9:17])[0]
    code = head[17]
    seqs, docs = struct.unpack("<QQ", head[18:34])
    if version != 1 or code not in CODE_DTYPES:
        raise ValueError(f"{idx_path}: unsupported version {version} or dtype code {code}")
    return {"dtype": CODE_DTYPES[code], "sequences": seqs, "document_count": docs}


def expected_idx_bytes(sequences: int, documents: int) -> int:
    return HEADER_BYTES + 4 * sequences + 8 * sequences + 8 * (documents + 1)


def indexed_dataset_class():
    """megatron-core's IndexedDataset (the reader of record), imported without its optional-kernel warnings and
    without torch's compiler (data_prep.lazy_compile: megatron-core's package import decorates its fusions)."""
    import logging
    import warnings

    from data_prep.lazy_compile import import_with_compile_deferred

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import_with_compile_deferred(("megatron.core",))
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    logging.getLogger("megatron.core").setLevel(logging.WARNING)
    return IndexedDataset


def read_index_arrays(idx_path: str):
    """(dtype, lengths, pointers, document_indices) of an .idx as read-only memmaps: nothing loaded into memory."""
    head = read_header(idx_path)
    n, d = head["sequences"], head["document_count"]
    mm = np.memmap(idx_path, mode="r", dtype=np.uint8)
    off = HEADER_BYTES
    lengths = np.frombuffer(mm, dtype=np.int32, count=n, offset=off)
    pointers = np.frombuffer(mm, dtype=np.int64, count=n, offset=off + 4 * n)
    docs = np.frombuffer(mm, dtype=np.int64, count=d, offset=off + 12 * n)
    return head["dtype"], lengths, pointers, docs


def append_shard(writer: "ShardWriter", prefix: str, chunk_bytes: int = 1 << 24) -> str:
    """Stream a whole shard onto ``writer``: .bin copied in chunks, index arrays appended chunk by chunk. Returns the
    sha256 of the source .bin as read (hashed while copied: the caller compares it with the source's manifest, so a
    damaged shard is not carried into a new one under a fresh checksum)."""
    writer.flush()
    dtype, lengths, _, docs = read_index_arrays(prefix + ".idx")
    if np.dtype(dtype) != writer.dtype:
        raise ValueError(f"{prefix}: dtype {np.dtype(dtype).name} differs from {writer.dtype.name}; merge shards "
                         "made with the same tokenizer")
    source_sha = hashlib.sha256()
    with io.open_read(prefix + ".bin") as f:
        for block in iter(lambda: f.read(chunk_bytes), b""):
            writer.bin.write(block)
            writer.bin_sha.update(block)
            source_sha.update(block)
    for lo in range(0, len(lengths), CHUNK):
        writer.lens.write(np.asarray(lengths[lo : lo + CHUNK]).tobytes())
    base = writer.sequences
    for lo in range(1, len(docs), CHUNK):
        writer.docs.write((np.asarray(docs[lo : lo + CHUNK]) + base).tobytes())
    writer.sequences += len(lengths)
    writer.documents += len(docs) - 1
    writer.tokens += int(lengths.sum(dtype=np.int64))
    return source_sha.hexdigest()

"""The streaming writer produces byte-for-byte what megatron-core's own builder writes, in bounded chunks."""

import numpy as np
import pytest
import torch

from data_prep.write import shards
from data_prep.write.shards import ShardWriter, indexed_dataset_class

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_writer_matches_megatron_builder_bytes(tmp_path, monkeypatch, dtype):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(0)
    docs = []
    for _ in range(300):
        nseq = 1 + int(rng.integers(0, 3))  # some documents made of several sequences
        docs.append([rng.integers(0, 60000, size=int(rng.integers(1, 50))).astype(dtype) for _ in range(nseq)])
    monkeypatch.setattr(shards, "CHUNK", 7)  # index arrays copied in many small chunks
    w = ShardWriter(str(tmp_path / "ours"), dtype, flush_tokens=100)
    for d in docs:
        w.add_document(d)
    stats = w.finalize()

    b = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=dtype)
    for d in docs:
        for seq in d:
            b.add_item(torch.from_numpy(seq.astype(np.int64)))
        b.end_document()
    b.finalize(str(tmp_path / "ref.idx"))

    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()
    assert (tmp_path / "ours.idx").read_bytes() == (tmp_path / "ref.idx").read_bytes()
    assert stats["documents"] == 300 and stats["sequences"] == sum(len(d) for d in docs)
    ds = indexed_dataset_class()(str(tmp_path / "ours"))
    flat = [s for d in docs for s in d]
    assert all(ds[i].tolist() == flat[i].tolist() for i in range(len(flat)))
    assert not list(tmp_path.glob("*.tmp"))


def test_pointers_are_int64_past_2_gib(tmp_path):
    """Pointers are computed in int64: lengths summing past 2^31 bytes do not wrap (index only, no data)."""
    w = ShardWriter(str(tmp_path / "big"), np.int32)
    w.lens.write(np.full(3, 2**29, dtype=np.int32).tobytes())  # 3 sequences of 2^29 int32 tokens = 6 GiB
    w.docs.write(np.array([3], dtype=np.int64).tobytes())
    w.sequences, w.documents = 3, 1
    w.lens.flush()
    w.docs.flush()
    w._write_index(str(tmp_path / "big.idx"))
    raw = (tmp_path / "big.idx").read_bytes()
    ptrs = np.frombuffer(raw, dtype=np.int64, count=3, offset=shards.HEADER_BYTES + 12)
    assert ptrs.tolist() == [0, 2**31, 2**32]
    w.abort()

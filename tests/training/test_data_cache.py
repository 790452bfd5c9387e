"""The dataset index cache runs no code (a planted pickle never runs; the cache is rebuilt) and never goes stale
(regenerated shards at the same prefix get fresh indices): issue 25, item 1."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from recipes.config.loading import load_recipe
from recipes.train.data import DataError, build_datasets
from data_prep.write.shards import ShardWriter

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
VOCAB, EOD = 300, 0


def write_shards(root: Path, shards: int, docs: int, seed: int) -> Path:
    """``shards`` tiny shards of ``docs`` random documents each (every document ends with EOD) and their manifest."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(shards):
        w = ShardWriter(str(root / f"shard_{i:06d}"), np.uint16, fsync=False)
        for _ in range(docs):
            n = int(rng.integers(3, 40))
            w.add_document([np.append(rng.integers(1, VOCAB, n), EOD).astype(np.uint16)])
        entries.append({"prefix": f"shard_{i:06d}", **w.finalize()})
    manifest = {"tokenizer": {"type": "test", "path": "", "vocab_size": VOCAB, "eod_id": EOD, "pad_id": None},
                "dtype": "uint16", "shards": entries}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(autouse=True, scope="module")
def one_rank_group(tmp_path_factory):
    """megatron-core's blended datasets ask torch.distributed for the rank: a real one-process gloo group (reused when
    another in-process test already holds a world of one: a second init_process_group would fail)."""
    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg') / 'store'}", rank=0,
                                world_size=1)
    yield
    if made:
        dist.destroy_process_group()


def recipe(*overrides):
    return load_recipe(REPO / "configs" / "runs" / "tiny-cpu.yaml", list(overrides))


def samples(ds, n=None):
    return [ds[i]["tokens"].tolist() for i in range(len(ds) if n is None else min(n, len(ds)))]


class Payload:
    """Unpickling this creates ``path``: proof that a pickle ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_planted_pickle_never_runs_and_the_cache_is_rebuilt(tmp_path):
    data = write_shards(tmp_path / "data", shards=3, docs=40, seed=1)
    r = recipe(f"data.manifests=[{data}]")
    cache = tmp_path / "cache"
    first, _ = build_datasets(r, 64, 8, str(cache))
    want = samples(first)
    planted = list(cache.rglob("*GPTDataset-train-document_index.npy"))
    assert len(planted) == 1, list(cache.rglob("*"))
    marker = tmp_path / "PWNED"
    planted[0].write_bytes(pickle.dumps(Payload(str(marker))))
    again, _ = build_datasets(r, 64, 8, str(cache))
    assert not marker.exists(), "the planted pickle ran"
    assert np.load(planted[0], allow_pickle=False).dtype.kind == "i"  # rebuilt as a real index
    assert samples(again) == want


def test_a_pickle_replaced_after_the_check_is_refused_not_run(tmp_path):
    """megatron-core's own numpy.load calls never unpickle (allow_pickle forced off), whatever reaches them."""
    from megatron.core.datasets import gpt_dataset

    from recipes.train.data_cache import no_pickle_loads, pickle_refusal

    no_pickle_loads()
    marker, f = tmp_path / "PWNED", tmp_path / "x-GPTDataset-train-sample_index.npy"
    f.write_bytes(pickle.dumps(Payload(str(marker))))
    with pytest.raises(ValueError) as err:
        gpt_dataset.numpy.load(f, allow_pickle=True, mmap_mode="r")
    assert not marker.exists()
    assert str(f) in pickle_refusal(err.value, tmp_path)


def test_cache_file_checks_name_what_is_wrong(tmp_path):
    from recipes.train.data_cache import check_npy

    good = tmp_path / "h-GPTDataset-train-sample_index.npy"
    np.save(good, np.zeros((5, 2), dtype=np.int32))
    assert check_npy(good) is None
    cases = {"h-GPTDataset-train-document_index.npy": np.zeros(4, dtype=np.float64),
             "h-GPTDataset-valid-sample_index.npy": np.zeros(6, dtype=np.int32),
             "h-BlendedDataset-train-dataset_index.npy": np.array([None, 1], dtype=object)}
    for name, arr in cases.items():
        np.save(tmp_path / name, arr, allow_pickle=True)
    assert "dtype float64" in check_npy(tmp_path / "h-GPTDataset-train-document_index.npy")
    assert "shape (6,)" in check_npy(tmp_path / "h-GPTDataset-valid-sample_index.npy")
    assert "dtype object" in check_npy(tmp_path / "h-BlendedDataset-train-dataset_index.npy")
    short = tmp_path / "h-GPTDataset-train-shuffle_index.npy"
    np.save(short, np.arange(100, dtype=np.int64))
    short.write_bytes(short.read_bytes()[:-8])
    assert "truncated" in check_npy(short)


def test_regenerated_shards_at_the_same_prefix_get_a_fresh_index(tmp_path):
    data = tmp_path / "data"
    r = recipe(f"data.manifests=[{data}]")
    cache = tmp_path / "cache"
    write_shards(data, shards=2, docs=30, seed=1)
    build_datasets(r, 64, 8, str(cache))
    write_shards(data, shards=2, docs=90, seed=2)  # same prefixes, other documents and lengths
    got, _ = build_datasets(r, 200, 8, str(cache))
    want, _ = build_datasets(r, 200, 8, str(tmp_path / "fresh_cache"))
    assert samples(got) == samples(want)

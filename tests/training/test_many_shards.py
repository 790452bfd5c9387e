"""A manifest of thousands of shards builds as one concatenated dataset (recipes/train/shard_set.py) whose samples
are those of one dataset over the same shards merged into one shard."""
from __future__ import annotations

import os

import numpy as np
import pytest

from data_prep.write.shards import ShardWriter, append_shard
from recipes.train.data import build_datasets
from tests.training.test_data_cache import one_rank_group, recipe, samples, write_shards  # noqa: F401

pytestmark = pytest.mark.multiproc  # not process-starting, but writes 4,000 files: kept out of the fast tier


def test_thousands_of_tiny_shards_sample_like_the_same_shards_merged(tmp_path):
    data = write_shards(tmp_path / "many", shards=2000, docs=3, seed=3)
    merged_prefix = str(tmp_path / "merged" / "all")
    os.makedirs(tmp_path / "merged")
    w = ShardWriter(merged_prefix, np.uint16, fsync=False)
    for i in range(2000):
        append_shard(w, str(data / f"shard_{i:06d}"))
    w.finalize()
    many, many_valid = build_datasets(recipe(f"data.manifests=[{data}]"), 300, 30, str(tmp_path / "c1"))
    one, one_valid = build_datasets(recipe(f"data.manifests=[{data}]", f"data.blend=[[1.0,{merged_prefix}]]"),
                                    300, 30, str(tmp_path / "c2"))
    assert len(many) == len(one) and len(many_valid) == len(one_valid)
    assert samples(many) == samples(one)
    assert samples(many_valid) == samples(one_valid)

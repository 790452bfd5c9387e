"""The data cache indexes shards; it never chooses them (round 4 of the security read): a shard-set index planted in
the cache under the name the run will look for, naming another file, is rebuilt from the manifest's shards, and a
ShardSet refuses an index that names other shards than its manifest's."""
from __future__ import annotations

import json

import pytest

from recipes.train.shard_set import ShardSet, build_index, set_path
from tests.support.corpus import write_corpus

pytestmark = pytest.mark.unit


def test_a_planted_index_never_chooses_the_files_that_train(tmp_path):
    manifest = write_corpus(tmp_path / "data", shards=2, max_bytes=20_000)
    prefixes = [str(manifest.parent / f"shard_{i:03d}") for i in range(2)]
    foreign = write_corpus(tmp_path / "foreign", shards=1, max_bytes=5_000).parent / "shard_000"
    cache = tmp_path / "cache"
    path = set_path(cache, prefixes, "identity")
    build_index(path, [str(foreign)])  # what a planter would leave under that name
    planted = json.loads((path / "shards.json").read_text())["prefixes"]
    assert planted == [str(foreign)]
    with pytest.raises(ValueError, match="names other shards than the manifest's"):
        ShardSet(path, prefixes)
    build_index(path, prefixes)  # the run's own build: rebuilt for the manifest's shards
    got = ShardSet(path, prefixes)
    from data_prep.write.shards import read_index_arrays

    assert got.prefixes == prefixes
    assert len(got) == sum(len(read_index_arrays(p + ".idx")[1]) for p in prefixes)
    assert json.loads((path / "shards.json").read_text())["prefixes"] == prefixes

"""Training trusts a shard only as its manifest records it (data.verify, data_prep.write.verify): a .idx flipped in
one byte (same size, bit rot) stops every rank before the first step, naming the file; a .bin changed in one byte
passes the default check (its size is the index's) and is stopped by data.verify=full."""
from __future__ import annotations

import hashlib
import json

import pytest

from tests.support.corpus import write_corpus
from tests.support.runs import RECIPE, pretrain

pytestmark = pytest.mark.multiproc


def _recorded_corpus(root):
    manifest = write_corpus(root, shards=2, max_bytes=200_000)
    m = json.loads(manifest.read_text())
    for sh in m["shards"]:
        for ext in ("idx", "bin"):
            sh[f"sha256_{ext}"] = hashlib.sha256((root / f"{sh['prefix']}.{ext}").read_bytes()).hexdigest()
    manifest.write_text(json.dumps(m))
    return manifest


def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_shard_stops_training_naming_the_file(tmp_path):
    manifest = _recorded_corpus(tmp_path / "data")
    args = [f"data.manifests=[{manifest}]", "training.train_steps=1"]
    _flip(tmp_path / "data" / "shard_001.bin", 1000)
    pretrain(2, *args, f"checkpoint.dir={tmp_path / 'a'}", config=RECIPE)  # the default check: sizes and indexes
    out = pretrain(2, *args, f"checkpoint.dir={tmp_path / 'b'}", "data.verify=full", config=RECIPE, check=False)
    assert out.returncode != 0 and "shard_001.bin" in out.stdout + out.stderr, out.stderr[-3000:]
    _flip(tmp_path / "data" / "shard_000.idx", 40)
    out = pretrain(2, *args, f"checkpoint.dir={tmp_path / 'c'}", config=RECIPE, check=False)
    assert out.returncode != 0 and "shard_000.idx" in out.stdout + out.stderr, out.stderr[-3000:]
    metrics = tmp_path / "c" / "logs" / "metrics.jsonl"
    assert not metrics.exists() or '"loss"' not in metrics.read_text()  # no step trained

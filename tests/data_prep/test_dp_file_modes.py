"""Outputs are created with explicit modes: 0644 for data (shards, indexes, manifests, logs) whatever the umask
(a umask of 0 must not make them world-writable), 0600 where asked for secrets; a stricter umask still wins."""

import os
import stat

import numpy as np
import pytest

from data_prep import io
from data_prep.write.rejects import RejectLog
from data_prep.write.shards import ShardWriter

pytestmark = pytest.mark.unit


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda m: os.umask(m)
    os.umask(old)


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_data_files_are_0644_and_secrets_0600_under_a_permissive_umask(tmp_path, umask):
    umask(0)
    io.atomic_write(str(tmp_path / "manifest.json"), "{}")
    io.atomic_write(str(tmp_path / "token"), "s3cret", mode=io.SECRET_MODE)
    w = ShardWriter(str(tmp_path / "shard_000000"), np.uint16)
    w.add_document([np.arange(5, dtype=np.uint16)])
    w.finalize()
    log = RejectLog(str(tmp_path), "shard_000000")
    log.add("f.jsonl", "line", 1, "empty_text")
    log.commit()
    assert {p.name: _mode(p) for p in tmp_path.iterdir()} == {
        "manifest.json": 0o644, "token": 0o600, "shard_000000.bin": 0o644, "shard_000000.idx": 0o644,
        "shard_000000.rejects.jsonl": 0o644}


def test_a_stricter_umask_still_narrows_and_a_leftover_tmp_does_not_keep_its_mode(tmp_path, umask):
    umask(0o077)
    io.atomic_write(str(tmp_path / "a"), "x")
    assert _mode(tmp_path / "a") == 0o600
    umask(0)
    leftover = tmp_path / "b.tmp"
    leftover.write_text("old")
    os.chmod(leftover, 0o666)
    io.atomic_write(str(tmp_path / "b"), "new")
    assert _mode(tmp_path / "b") == 0o644 and (tmp_path / "b").read_text() == "new"

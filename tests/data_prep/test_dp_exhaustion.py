"""Exhaustion: a worker killed under its unit, a record too large for memory, a disk that fills up.

Each failure is that unit's alone (recorded in failed_units.json and the exit-1 listing, no manifest claims
completeness), the other units complete, and a rerun once the cause is gone gives the same bytes as a clean run.
"""

import gzip
import json
import os

import orjson
import pytest
from tests.support.data_prep import run_cli, tree_bytes

pytestmark = pytest.mark.multiproc


def _gz_inputs(d, n=4, docs=60):
    d.mkdir()
    for i in range(n):
        raw = b"".join(orjson.dumps({"text": f"file {i} document {k} " * 20}) + b"\n" for k in range(docs))
        (d / f"f{i}.jsonl.gz").write_bytes(gzip.compress(raw, mtime=0))
    return d


def _shards(out):
    return {k: v for k, v in tree_bytes(out).items() if k.endswith((".bin", ".idx", ".stats.json"))}


def test_a_killed_worker_fails_its_unit_alone_and_a_rerun_completes(tmp_path, sp_model):
    d = _gz_inputs(tmp_path / "in")
    clean = tmp_path / "clean"
    run_cli("tokenize", d, "-o", clean, "-t", sp_model, "-q", "-j", "2")
    out = tmp_path / "out"
    # the worker that takes shard_000001 SIGKILLs itself, as the OOM killer would
    r = run_cli("tokenize", d, "-o", out, "-t", sp_model, "-q", "-j", "2", check=False,
                env_extra={"DATA_PREP_TEST_KILL_UNIT": "shard_000001"})
    assert r.returncode == 1, r.stderr
    assert "BrokenProcessPool" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert f"shard_000001: {d / 'f1.jsonl.gz'}: worker process killed by SIGKILL" in r.stderr
    failed = json.load(open(out / "failed_units.json"))
    assert [(f["unit"], f["path"]) for f in failed] == [("shard_000001", str(d / "f1.jsonl.gz"))]
    assert "SIGKILL" in failed[0]["error"]
    assert not (out / "manifest.json").exists()
    for i in (0, 2, 3):
        assert (out / f"shard_00000{i}.stats.json").exists()
    assert not (out / "shard_000001.stats.json").exists()

    r = run_cli("tokenize", d, "-o", out, "-t", sp_model, "-q", "-j", "2")
    assert _shards(out) == _shards(clean)
    assert not (out / "failed_units.json").exists()
    assert json.load(open(out / "manifest.json"))["totals"] == json.load(open(clean / "manifest.json"))["totals"]

"""Exhaustion: a worker killed under its unit, a record too large for memory, a disk that fills up.

Each failure is that unit's alone (recorded in failed_units.json and the exit-1 listing, no manifest claims
completeness), the other units complete, and a rerun once the cause is gone gives the same bytes as a clean run.
"""

import gzip
import json
import os
import subprocess
import zlib

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


CAP = 400 << 20  # RLIMIT_AS of the CLI and each worker: ~150 MiB of interpreter and libraries, plus headroom
BOMB = 512 << 20  # decompressed bytes of one newline-less line: more than the cap


def _bomb(path):
    """A .jsonl.gz whose one line is BOMB bytes long and has no newline (~0.5 MiB on disk)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(c.compress(b'{"text": "'))
        block = b"a" * (1 << 20)
        for _ in range(BOMB >> 20):
            f.write(c.compress(block))
        f.write(c.flush())


def test_a_gzip_bomb_without_newlines_under_a_memory_cap(tmp_path, sp_model):
    d = _gz_inputs(tmp_path / "in", n=3)
    _bomb(d / "f1b_bomb.jsonl.gz")  # sorts between f1 and f2: unit shard_000002
    out = tmp_path / "out"
    # A limit above what memory allows: the unit runs out of memory and fails alone, its reason recorded.
    r = run_cli("tokenize", d, "-o", out, "-t", sp_model, "-q", "-j", "2", "--max-record-size", "2Gi",
                check=False, address_space=CAP)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    failed = json.load(open(out / "failed_units.json"))
    assert [(f["unit"], f["path"]) for f in failed] == [("shard_000002", str(d / "f1b_bomb.jsonl.gz"))]
    assert "out of memory" in failed[0]["error"] and "out of memory" in r.stderr
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.glob("*.stats.json")) == [f"shard_00000{i}.stats.json" for i in (0, 1, 3)]

    # The default limit (64 MiB): the line is rejected as record_too_large in bounded memory; the run completes.
    r = run_cli("tokenize", d, "-o", out, "-t", sp_model, "-q", "-j", "2", address_space=CAP)
    m = json.load(open(out / "manifest.json"))
    assert m["totals"]["rejected"] == {"record_too_large": 1}
    assert m["totals"]["documents"] == 3 * 60
    log = [json.loads(x) for x in open(out / m["reject_log"])]
    assert log == [{"file": str(d / "f1b_bomb.jsonl.gz"), "line": 1, "reason": "record_too_large"}]
    assert not (out / "failed_units.json").exists()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real tmpfs of a chosen size (root only): ``mount(size)``, remountable larger to free space."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    mounted = []

    def mount(size):
        opts = f"size={size}" if not mounted else f"remount,size={size}"
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
        mounted.append(size)
        return mnt

    yield mount
    if mounted:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_disk_stops_cleanly_and_a_rerun_after_freeing_space_gives_the_same_bytes(tmp_path, sp_model,
                                                                                       small_tmpfs):
    d = _gz_inputs(tmp_path / "in", n=4, docs=600)
    clean = tmp_path / "clean"
    run_cli("tokenize", d, "-o", clean, "-t", sp_model, "-q", "-j", "2")
    need = sum(len(v) for v in tree_bytes(clean).values())
    mnt = small_tmpfs(f"{need // 2 // 4096 * 4096}")  # half of what the run writes
    out = mnt / "out"
    r = run_cli("tokenize", d, "-o", out, "-t", sp_model, "-q", "-j", "2", check=False)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert f"no space left for {out} (No space left on device)" in r.stderr, r.stderr
    assert not (out / "manifest.json").exists()
    assert [p.name for p in out.iterdir() if ".tmp" in p.name] == []  # nothing half-written left behind
    small_tmpfs(f"{need * 2}")  # free space
    run_cli("tokenize", d, "-o", out, "-t", sp_model, "-q", "-j", "2")
    got, want = tree_bytes(out), tree_bytes(clean)
    for name in ("manifest.json", "plan.json"):  # these name the output directory
        got.pop(name), want.pop(name)
    assert got == want

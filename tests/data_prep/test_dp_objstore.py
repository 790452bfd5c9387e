"""Object storage: data_prep reading and writing s3:// against a real S3-protocol server (moto's standalone server,
started on loopback by these tests, tests/support/s3.py), compared with a local run of the same corpus.

Tier ``ssh``: each test needs a service the test starts (the S3 server), like the loopback sshd tests."""
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.data_prep import REPO, run_cli
from tests.support.s3 import ACCESS_KEY, MIN_PART, SECRET_KEY, s3_server

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3_server(str(tmp_path_factory.mktemp("s3"))) as server:
        yield server


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, texts):
    """jsonl (split into byte ranges), a parquet file of several row groups (split along them), a .gz, a .txt."""
    import gzip

    import orjson

    from data_prep.tools.sample_corpus import build

    d = tmp_path_factory.mktemp("objcorpus")
    build(str(d), 900_000)
    pq.write_table(pa.table({"text": texts[: len(texts) // 2] * 3}), d / "part.parquet", row_group_size=8)
    with gzip.open(d / "small.jsonl.gz", "wb") as f:
        for t in texts[-12:]:
            f.write(orjson.dumps({"text": t}) + b"\n")
        f.write(b"{not json\n")  # a reject, so the reject log travels too
    (d / "note.txt").write_text(texts[3])
    return d


def _upload_dir(client, local, bucket, prefix):
    client.create_bucket(Bucket=bucket)
    for name in sorted(os.listdir(local)):
        client.upload_file(str(local / name), bucket, f"{prefix}/{name}")


def _objects(client, bucket, prefix):
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) + 1:]] = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
    return out


def _shard_bytes(files: dict) -> dict:
    return {k: v for k, v in files.items() if k.endswith((".bin", ".idx"))}


def _local_files(d):
    return {n: (d / n).read_bytes() for n in os.listdir(d)}


ARGS = ["--shard-size", "150K", "--upload-part-size", str(MIN_PART)]


def test_s3_to_s3_gives_the_local_shards_byte_for_byte_and_resumes(tmp_path, s3, corpus, sp_model):
    c = s3.client()
    _upload_dir(c, corpus, "corpus", "in")
    c.create_bucket(Bucket="shards")
    env = s3.env()  # endpoint and credentials only through botocore's own chain (AWS_ENDPOINT_URL_S3, AWS_*)
    local = tmp_path / "local"
    run_cli("tokenize", corpus, "-o", local, "-t", sp_model, "-j", "2", *ARGS, env_extra=env)
    want = _shard_bytes(_local_files(local))
    m_local = json.loads((local / "manifest.json").read_bytes())
    assert len(want) >= 8 and any(".parquet" in str(s["inputs"]) and s["inputs"][0]["start"] > 0
                                  for s in m_local["shards"])  # byte ranges and row groups both cut

    r = run_cli("tokenize", "s3://corpus/in/", "-o", "s3://shards/run1", "-t", sp_model, "-j", "2", *ARGS,
                env_extra=env)
    got = _objects(c, "shards", "run1")
    assert _shard_bytes(got) == want
    m = json.loads(got["manifest.json"])
    assert m["totals"] == m_local["totals"] and m["blend"] == m_local["blend"]
    assert got["rejects.jsonl"].count(b"\n") == 1 and b"s3://corpus/in/small.jsonl.gz" in got["rejects.jsonl"]
    assert "already complete" in r.stderr

    # the same command again: every unit resumes from its marker, nothing is rewritten
    before = {o["Key"]: o["LastModified"] for o in c.list_objects_v2(Bucket="shards", Prefix="run1/")["Contents"]
              if o["Key"].endswith((".bin", ".idx", ".stats.json"))}
    r = run_cli("tokenize", "s3://corpus/in/", "-o", "s3://shards/run1", "-t", sp_model, "-j", "2", *ARGS,
                env_extra=env)
    assert f"{len(m['shards']) + len(m['empty_units'])} already complete, 0 to do" in r.stderr
    after = {o["Key"]: o["LastModified"] for o in c.list_objects_v2(Bucket="shards", Prefix="run1/")["Contents"]
             if o["Key"] in before}
    assert after == before

    # two slices (two "nodes"), endpoint given as an option this time; the last one writes the manifest
    opt = ["--storage-option", f"endpoint_url={s3.endpoint}"]
    env_no_endpoint = {k: v for k, v in env.items() if not k.startswith("AWS_ENDPOINT_URL")}
    for i in (0, 1):
        run_cli("tokenize", "s3://corpus/in/", "-o", "s3://shards/sliced", "-t", sp_model, "-j", "1", *ARGS, *opt,
                "--slice", f"{i}/2", env_extra=env_no_endpoint)
    sliced = _objects(c, "shards", "sliced")
    assert _shard_bytes(sliced) == want and "manifest.json" in sliced


def test_a_unit_reads_its_byte_range_with_ranged_gets(tmp_path, s3):
    """A 24 MB object cut into 4 MB units: planning reads a little past each boundary; one unit reads its range
    (and at most one read-ahead block past it), never the object. Counted server side."""
    import orjson

    from data_prep import io, objstore
    from data_prep.read.formats import read_piece
    from data_prep.read.units import list_inputs, plan_units

    line = orjson.dumps({"text": "x" * 1000}) + b"\n"
    data = line * (24_000_000 // len(line))
    c = s3.client()
    c.create_bucket(Bucket="big")
    c.put_object(Bucket="big", Key="c/big.jsonl", Body=data)
    io.configure({"endpoint_url": s3.endpoint}, MIN_PART)
    try:
        os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        with s3.recording_requests() as plan_reqs:
            units = plan_units(list_inputs(["s3://big/c/"]), 4_000_000)
        gets = [r for r in plan_reqs if r["method"] == "GET" and "list-type" not in r["url"]]
        assert len(units) == 6 and len(gets) == 5  # one small probe per boundary: no HEAD, no other GET
        assert [r for r in plan_reqs if r["method"] != "GET"] == []
        assert all(_range_len(r) <= 2 * objstore.PROBE_BLOCK for r in gets)  # the read and one read-ahead block

        piece = units[2].pieces[0]
        with s3.recording_requests() as read_reqs:
            n = sum(1 for _ in read_piece(piece, "text"))
        assert n == (piece.end - piece.start) // len(line)
        fetched = sum(_range_len(r) for r in read_reqs if r["method"] == "GET")
        assert all("range" in {k.lower() for k in r["headers"]} for r in read_reqs if r["method"] == "GET")
        assert piece.end - piece.start <= fetched <= piece.end - piece.start + objstore.READ_BLOCK
        assert fetched < len(data) / 2
    finally:
        os.environ.pop("AWS_ACCESS_KEY_ID")
        os.environ.pop("AWS_SECRET_ACCESS_KEY")
        io.configure({})


def _range_len(req) -> int:
    h = {k.lower(): v for k, v in req["headers"].items()}
    lo, hi = h["range"].split("=")[1].split("-")
    return int(hi) - int(lo) + 1


def test_listing_2100_objects_is_paged_once(tmp_path, s3, caplog):
    """Planning over 2,100 objects: ListObjectsV2 pages of 1,000 (3 requests, the last one of 100, counted by the
    server), no HEAD or GET per object, progress logged per page. (10,000 objects cost 100 s of CPU putting them
    into the server and test nothing more.)"""
    import fsspec

    from data_prep import io
    from data_prep.read.units import list_inputs, plan_units

    c = s3.client()
    c.create_bucket(Bucket="many")
    fs = fsspec.filesystem("s3", endpoint_url=s3.endpoint, key=ACCESS_KEY, secret=SECRET_KEY, skip_instance_cache=True)
    fs.pipe({f"many/docs/{i:05d}.jsonl": b'{"text": "document %d"}\n' % i for i in range(2_100)}, batch_size=64)
    io.configure({"endpoint_url": s3.endpoint})
    try:
        os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        with s3.recording_requests() as reqs:
            pieces = list_inputs(["s3://many/docs/"])
            units = plan_units(pieces, 2_100)
            keys = [u.key() for u in units]
        lists = [r for r in reqs if r["method"] == "GET" and "list-type=2" in r["url"]]
        assert len(pieces) == 2_100 and len(keys) == len(units) > 10
        assert len(lists) == 3, [r["url"] for r in lists]
        assert [r for r in reqs if r not in lists] == []  # sizes and times come from the listing
        # progress: one line per page when asked for it (default: every 2 s of a long listing)
        from data_prep import objstore

        caplog.set_level("INFO", logger="data_prep.objstore")
        caplog.clear()  # the planning listing above may have logged its own progress (every 2 s when slow)
        objstore.list_tree("s3://many/docs/", progress_every=0)
        lines = [r.message for r in caplog.records if r.message.startswith("listing s3://many/docs/")]
        assert [ln.split(": ")[1].split(" ")[0] for ln in lines] == ["1,000", "2,000", "2,100"]
    finally:
        os.environ.pop("AWS_ACCESS_KEY_ID")
        os.environ.pop("AWS_SECRET_ACCESS_KEY")
        io.configure({})


def _start(args, env):
    return subprocess.Popen([sys.executable, "-m", "data_prep", "tokenize", *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def test_sigkill_mid_upload_then_rerun_gives_the_same_shards(tmp_path, s3, corpus, sp_model):
    """The driver and its worker killed while a multipart upload is in flight (seen on the server): no completion
    marker points at a missing or partial object, and the rerun gives the local run's shards byte for byte."""
    c = s3.client()
    c.create_bucket(Bucket="kill")
    env = dict(s3.env(), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    # the killed run's staging dir (with the shard it was uploading) stays in tmp_path, not in the system temp dir
    args = ["--shard-size", "450K", "--upload-part-size", str(MIN_PART), "-j", "1", "--staging-dir", tmp_path / "st"]
    local = tmp_path / "local"
    run_cli("tokenize", corpus, "-o", local, "-t", sp_model, *args, env_extra=env)
    want = _shard_bytes(_local_files(local))
    assert any(len(v) >= 2 * MIN_PART for k, v in want.items() if k.endswith(".bin"))  # multipart uploads happen

    killed = 0
    for attempt in range(4):
        out = f"s3://kill/try{attempt}"
        p = _start([corpus, "-o", out, "-t", sp_model, *args], env)
        try:
            while p.poll() is None:
                if c.list_multipart_uploads(Bucket="kill", Prefix=f"try{attempt}/").get("Uploads"):
                    os.killpg(p.pid, signal.SIGKILL)
                    killed += 1
                    break
                time.sleep(0.002)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if p.returncode != -signal.SIGKILL:
            continue
        objs = {o["Key"]: o["Size"] for o in
                c.list_objects_v2(Bucket="kill", Prefix=f"try{attempt}/").get("Contents", [])}
        assert f"try{attempt}/manifest.json" not in objs
        in_flight = {u["Key"] for u in c.list_multipart_uploads(Bucket="kill", Prefix=f"try{attempt}/")["Uploads"]}
        for key in objs:
            if key.endswith(".stats.json"):  # a marker: its data objects are all there, whole
                st = json.loads(c.get_object(Bucket="kill", Key=key)["Body"].read())
                if st["documents"]:
                    stem = key[: -len(".stats.json")]
                    assert objs[stem + ".bin"] == st["bytes"] and objs[stem + ".idx"] == st["idx_bytes"]
                    assert stem + ".bin" not in in_flight
        for key in in_flight:  # the object being uploaded has no marker yet
            assert key.rsplit(".", 1)[0] + ".stats.json" not in objs
        r = run_cli("tokenize", corpus, "-o", out, "-t", sp_model, *args, env_extra=env)
        assert _shard_bytes(_objects(c, "kill", f"try{attempt}")) == want, r.stderr
        break
    assert killed, "no run was killed while an upload was in flight"


def test_credentials_reach_no_log_output_or_command_line(tmp_path, s3, corpus, sp_model):
    c = s3.client()
    c.create_bucket(Bucket="secret-check")
    env = s3.env()
    p = _start([corpus, "-o", "s3://secret-check/out", "-t", sp_model, *ARGS, "-j", "2"], env)
    cmdlines = []
    while p.poll() is None:  # every process of the run, as any user of the machine sees it with ps
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmdlines.append(open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"))
                except OSError:
                    pass
        time.sleep(0.05)
    out, err = p.communicate()
    assert p.returncode == 0, err
    texts = [out.decode(), err.decode(), *cmdlines,
             *(v.decode(errors="replace") for v in _objects(c, "secret-check", "out").values())]
    assert any("data_prep" in t for t in cmdlines)
    for secret in (SECRET_KEY, ACCESS_KEY):
        assert not [t[:200] for t in texts if secret in t]

    # credentials as options are refused, without echoing them; a failing endpoint names itself, not the keys
    r = run_cli("tokenize", corpus, "-o", "s3://secret-check/x", "-t", sp_model, "--storage-option",
                f"secret={SECRET_KEY}", check=False, env_extra=env)
    assert r.returncode == 2 and "AWS_SECRET_ACCESS_KEY" in r.stderr and SECRET_KEY not in r.stderr + r.stdout
    r = run_cli("tokenize", corpus, "-o", "s3://no-such-bucket/x", "-t", sp_model, check=False, env_extra=env)
    assert r.returncode != 0 and "s3://no-such-bucket/x" in r.stderr and s3.endpoint in r.stderr
    assert SECRET_KEY not in r.stderr + r.stdout and ACCESS_KEY not in r.stderr + r.stdout

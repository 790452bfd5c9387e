"""Bad records are counted by reason and logged, the manifest balances; broken inputs fail loudly but alone."""

import gzip
import json
import os

import orjson
import pytest
import sentencepiece as spm
import zstandard
from tests.support.data_prep import read_all_docs, run_cli

pytestmark = pytest.mark.multiproc

GOOD = ["first good document", "second good one", "third"]


def _bad_jsonl(path):
    lines = [
        orjson.dumps({"text": GOOD[0]}),
        b'{"text": "unterminated',                     # malformed_json
        b'["a", "list"]',                              # not_an_object
        orjson.dumps({"content": "no text field"}),    # missing_text
        orjson.dumps({"text": None}),                  # missing_text (null)
        orjson.dumps({"text": 42}),                    # non_string_text
        orjson.dumps({"text": ""}),                    # empty_text
        orjson.dumps({"text": "   \n\t "}),           # empty_text (whitespace only)
        b'{"text": "bad \xff\xfe bytes"}',             # invalid_utf8
        b'{"text": "lone \\ud800 surrogate"}',         # invalid_utf8 (escape of a lone surrogate)
        orjson.dumps({"text": "nul \x00 byte"}),       # nul_bytes
        b"",                                           # blank line: not a record
        orjson.dumps({"text": GOOD[1]}),
        orjson.dumps({"text": GOOD[2] + " " * 5}),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    return offsets


def test_every_bad_record_is_counted_and_logged(tmp_path, sp_model):
    offsets = _bad_jsonl(tmp_path / "bad.jsonl")
    out = tmp_path / "out"
    r = run_cli("tokenize", tmp_path / "bad.jsonl", "-o", out, "-t", sp_model, "-q", "-j", "1")
    m = json.load(open(out / "manifest.json"))
    want = {"malformed_json": 1, "not_an_object": 1, "missing_text": 2, "non_string_text": 1, "empty_text": 2,
            "invalid_utf8": 2, "nul_bytes": 1}
    assert m["totals"]["rejected"] == want
    assert m["shards"][0]["rejected"] == want
    assert m["totals"]["input_records"] == 13 == m["totals"]["documents"] + sum(want.values())
    log = [json.loads(x) for x in open(out / m["reject_log"])]
    assert [(e["byte_offset"], e["reason"]) for e in log] == [
        (offsets[1], "malformed_json"), (offsets[2], "not_an_object"), (offsets[3], "missing_text"),
        (offsets[4], "missing_text"), (offsets[5], "non_string_text"), (offsets[6], "empty_text"),
        (offsets[7], "empty_text"), (offsets[8], "invalid_utf8"), (offsets[9], "invalid_utf8"),
        (offsets[10], "nul_bytes")]
    assert all(e["file"] == str(tmp_path / "bad.jsonl") for e in log)
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    assert read_all_docs(out)[1] == [ids + [sp.eos_id()] for ids in sp.encode([GOOD[0], GOOD[1], GOOD[2] + " " * 5])]
    assert "rejected 10" in r.stdout


def test_truncated_and_corrupt_compressed_inputs_fail_alone_and_are_retried(tmp_path, sp_model):
    d = tmp_path / "in"
    d.mkdir()
    raw = b"".join(orjson.dumps({"text": f"document number {i} " * 30}) + b"\n" for i in range(200))
    (d / "a_good.jsonl").write_bytes(raw[:2000].rsplit(b"\n", 1)[0] + b"\n")
    gz = gzip.compress(raw)
    (d / "b_trunc.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    zs = zstandard.ZstdCompressor().compress(raw)
    (d / "c_trunc.jsonl.zst").write_bytes(zs[: len(zs) // 2])
    (d / "d_garbage.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"not gzip at all" * 10)
    (d / "e_good.jsonl.zst").write_bytes(zs)
    out = tmp_path / "out"
    r = run_cli("tokenize", d, "-o", out, "-t", sp_model, "-q", "-j", "2", check=False)
    assert r.returncode == 1
    for name in ("b_trunc.jsonl.gz", "c_trunc.jsonl.zst", "d_garbage.jsonl.gz"):
        assert str(d / name) in r.stderr
    assert "a_good" not in r.stderr and "e_good" not in r.stderr
    assert not (out / "manifest.json").exists(), "an incomplete run must not leave a manifest"
    failed = json.load(open(out / "failed_units.json"))
    assert sorted(os.path.basename(f["path"]) for f in failed) == ["b_trunc.jsonl.gz", "c_trunc.jsonl.zst",
                                                                    "d_garbage.jsonl.gz"]
    # the good units are complete (shard + stats) and are not redone; the fixed inputs are
    assert (out / "shard_000000.stats.json").exists() and (out / "shard_000004.stats.json").exists()
    done_mtime = os.stat(out / "shard_000004.bin").st_mtime_ns
    (d / "b_trunc.jsonl.gz").write_bytes(gz)
    (d / "c_trunc.jsonl.zst").write_bytes(zs)
    (d / "d_garbage.jsonl.gz").write_bytes(gzip.compress(b"\n".join(raw.split(b"\n")[:3]) + b"\n"))
    run_cli("tokenize", d, "-o", out, "-t", sp_model, "-q", "-j", "2")
    assert os.stat(out / "shard_000004.bin").st_mtime_ns == done_mtime
    m = json.load(open(out / "manifest.json"))
    assert m["totals"]["documents"] == m["totals"]["input_records"] > 400
    assert not (out / "failed_units.json").exists()


def test_missing_tokenizer_and_unwritable_output_give_clear_errors(tmp_path, sp_model):
    (tmp_path / "a.jsonl").write_bytes(orjson.dumps({"text": "hello"}) + b"\n")
    r = run_cli("tokenize", tmp_path / "a.jsonl", "-o", tmp_path / "out", "-t", tmp_path / "nope.model", check=False)
    assert r.returncode == 2 and "tokenizer not found" in r.stderr and "nope.model" in r.stderr
    assert not (tmp_path / "out").exists()
    blocker = tmp_path / "file_not_dir"
    blocker.write_text("x")
    r = run_cli("tokenize", tmp_path / "a.jsonl", "-o", blocker / "out", "-t", sp_model, check=False)
    assert r.returncode == 2 and "not writable" in r.stderr and str(blocker / "out") in r.stderr
    r = run_cli("tokenize", tmp_path / "missing.jsonl", "-o", tmp_path / "o2", "-t", sp_model, check=False)
    assert r.returncode == 2 and "input not found" in r.stderr

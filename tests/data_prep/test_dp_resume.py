"""Determinism across worker counts, resume, and SIGKILL-at-any-moment + rerun = byte-identical output."""

import os
import signal
import subprocess
import sys
import time

import pytest
from dp_helpers import REPO, read_all_docs, run_cli, tree_bytes, write_jsonl

from data_prep.pipeline import Settings, run


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, texts):
    d = tmp_path_factory.mktemp("resume_in")
    # one big file (split into byte ranges) + several small ones (packed) + a bad record
    write_jsonl(d / "big.jsonl", [{"text": t} for t in texts[:40]])
    for i in range(5):
        write_jsonl(d / f"small_{i}.jsonl", [{"text": t} for t in texts[40 + 3 * i: 43 + 3 * i]])
    with open(d / "small_0.jsonl", "ab") as f:
        f.write(b"{broken\n")
    return d


def _settings(inputs, out, tok, workers):
    return Settings(inputs=[str(inputs)], output_dir=str(out), tokenizer=tok, workers=workers, shard_size=40_000,
                    quiet=True)


def test_same_bytes_whatever_the_worker_count(tmp_path, inputs, sp_model):
    m1 = run(_settings(inputs, tmp_path / "w1", sp_model, 1))
    run(_settings(inputs, tmp_path / "w2", sp_model, 2))
    run(_settings(inputs, tmp_path / "w3", sp_model, 3))
    assert len(m1["shards"]) >= 5, "the plan should have several units, including byte ranges of big.jsonl"
    assert sum(1 for s in m1["shards"] if s["inputs"][0]["path"].endswith("big.jsonl")) >= 3
    t1 = tree_bytes(tmp_path / "w1")
    assert t1 == tree_bytes(tmp_path / "w2") == tree_bytes(tmp_path / "w3")
    # the byte ranges of big.jsonl give exactly the documents of the whole file, in order
    import sentencepiece as spm
    import orjson

    sp = spm.SentencePieceProcessor(model_file=sp_model)
    lines = [orjson.loads(x)["text"] for x in open(inputs / "big.jsonl", "rb")]
    _, docs = read_all_docs(tmp_path / "w1")
    assert docs[: len(lines)] == [ids + [sp.eos_id()] for ids in sp.encode(lines)]


def test_resume_skips_complete_units_and_redoes_damaged_ones(tmp_path, inputs, sp_model):
    out = tmp_path / "out"
    run(_settings(inputs, out, sp_model, 2))
    ref = tree_bytes(out)
    mtimes = {p: os.stat(out / p).st_mtime_ns for p in ref if p.endswith((".bin", ".idx"))}
    # damage one unit's shard (truncate) and delete another's completion marker
    victim = sorted(p for p in mtimes if p.endswith(".bin"))[1]
    with open(out / victim, "r+b") as f:
        f.truncate(10)
    os.remove(out / "shard_000003.stats.json")
    run(_settings(inputs, out, sp_model, 2))
    assert tree_bytes(out) == ref
    redone = {p for p in mtimes if os.stat(out / p).st_mtime_ns != mtimes[p]}
    assert redone == {victim, victim.replace(".bin", ".idx"), "shard_000003.bin", "shard_000003.idx"}


def test_sigkill_at_any_moment_then_rerun_is_byte_identical(tmp_path, inputs, sp_model):
    ref_dir = tmp_path / "ref"
    run(Settings(inputs=[str(inputs)], output_dir=str(ref_dir), tokenizer=sp_model, shard_size=3_000, quiet=True))
    ref = tree_bytes(ref_dir)
    out = tmp_path / "killed"
    args = [sys.executable, "-m", "data_prep", "tokenize", str(inputs), "-o", str(out), "-t", sp_model,
            "--shard-size", "3000", "-j", "1", "-q"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    kills = 0
    for extra in (0.0, 0.02, 0.05, 0.1, 0.0, 0.03):
        before = len(list(out.glob("*.stats.json"))) if out.exists() else 0
        p = subprocess.Popen(args, cwd=REPO, env=env, start_new_session=True)
        # kill right after one more unit completes (+ a little): lands mid-shard, mid-rename or mid-stats
        while p.poll() is None and len(list(out.glob("*.stats.json"))) <= before:
            time.sleep(0.005)
        time.sleep(extra)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # the driver and its workers, mid-run
            kills += 1
        p.wait()
        if (out / "manifest.json").exists():  # killed after it finished: the manifest must then be the final one
            assert (out / "manifest.json").read_bytes() == ref["manifest.json"]
    assert kills >= 4, "the run finished before it could be killed; use a bigger input"
    run_cli("tokenize", inputs, "-o", out, "-t", sp_model, "--shard-size", "3000", "-j", "2", "-q")
    assert tree_bytes(out) == ref

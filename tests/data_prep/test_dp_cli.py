"""The README's main command end to end (small): sample-corpus -> train-tokenizer -> tokenize -> verify -> stats."""

import json

import pytest
from tests.support.data_prep import run_cli


@pytest.mark.multiproc
def test_demo_end_to_end(tmp_path):
    r = run_cli("demo", tmp_path / "demo", "-j", "2", "-q", "--corpus-mb", "0.5", "--vocab-size", "600")
    assert "[4/5] verify: OK" in r.stdout, r.stdout
    m = json.load(open(tmp_path / "demo" / "shards" / "manifest.json"))
    assert m["format"] == "megatron-mmidx" and m["tokenizer"]["type"] == "sentencepiece"
    assert m["tokenizer"]["vocab_size"] == 600 and m["dtype"] == "uint16"
    assert m["totals"]["documents"] == m["totals"]["input_records"] > 10 and m["totals"]["tokens"] > 50_000
    assert "--- document 0" in r.stdout  # a document decoded back to text
    lines = open(tmp_path / "demo" / "corpus" / "stdlib.jsonl").read().splitlines()
    assert all(json.loads(x)["license"] == "PSF-2.0" for x in lines)


@pytest.mark.unit
def test_sample_corpus_is_real_stdlib_text_and_reproducible(tmp_path):
    from data_prep.tools.sample_corpus import build

    a = build(str(tmp_path / "a"), 200_000)
    b = build(str(tmp_path / "b"), 200_000)
    assert open(a, "rb").read() == open(b, "rb").read()
    recs = [json.loads(x) for x in open(a)]
    assert 150_000 < sum(len(x) for x in open(a, "rb")) <= 200_000
    assert all(r["source"].endswith(".py") and r["text"] for r in recs)


@pytest.mark.unit
def test_rerun_of_corpus_and_tokenizer_keeps_identical_files(tmp_path):
    """sample-corpus and train-tokenizer are deterministic; rerun, they leave identical outputs untouched (same
    mtime), so a tokenize rerun resumes instead of redoing every unit (unit keys include input mtimes)."""
    from data_prep.steps.train_tokenizer import train
    from data_prep.tools.sample_corpus import build

    corpus = build(str(tmp_path / "c"), 200_000)
    model = train([corpus], str(tmp_path / "tok" / "sp"), vocab_size=400, quiet=True)
    before = {p: (open(p, "rb").read(), tmp_path.joinpath(p).stat().st_mtime_ns) for p in (corpus, model)}
    assert build(str(tmp_path / "c"), 200_000) == corpus
    assert train([corpus], str(tmp_path / "tok" / "sp"), vocab_size=400, quiet=True) == model
    assert {p: (open(p, "rb").read(), tmp_path.joinpath(p).stat().st_mtime_ns) for p in (corpus, model)} == before
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == ["sp.model", "sp.vocab"]  # no temporary left


@pytest.mark.unit
def test_the_benches_scratch_directory_is_private_not_a_fixed_tmp_name(tmp_path, monkeypatch):
    """Round 4 of the security read: `bench` and `bench-executors` defaulted to /tmp/data_prep_bench*, a name another
    user of the machine could create first (a link to where they want the bench to write)."""
    import os
    import stat
    import tempfile

    from data_prep import cli

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / "data_prep_bench"
    planted.symlink_to(tmp_path / "victim")
    made = cli._bench_dir(None, "data_prep_bench")
    assert made != str(planted) and stat.S_IMODE(os.stat(made).st_mode) == 0o700
    assert not (tmp_path / "victim").exists()
    assert cli._bench_dir(str(tmp_path / "mine"), "data_prep_bench") == str(tmp_path / "mine")

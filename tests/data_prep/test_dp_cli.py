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

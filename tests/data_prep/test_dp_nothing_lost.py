"""Reruns and accidents never destroy finished work (issue 42 item 1): an output inside its input is left out of the
listing (said once) and a rerun there keeps its manifest; an input that is the output, or another run's output, is
refused or skipped; a rerun into a finished output with other settings is refused naming each difference and
--overwrite, with nothing touched; train-tokenizer and merge keep what they would replace unless told."""

import json
import logging
import os

import pytest
from tests.support.data_prep import cli_here, tree_bytes, write_jsonl

from data_prep.pipeline import Settings, run
from data_prep.read.units import PlanError

pytestmark = pytest.mark.unit


@pytest.fixture()
def corpus(tmp_path, texts):
    d = tmp_path / "IN"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"text": t, "body": t.upper()} for t in texts[:12]])
    write_jsonl(d / "b.jsonl", [{"text": t, "body": t.upper()} for t in texts[12:20]])
    return d


def _settings(inputs, out, tok, **kw):
    return Settings(inputs=[str(i) for i in inputs], output_dir=str(out), tokenizer=tok, workers=1,
                    shard_size=kw.pop("shard_size", 20_000), quiet=True, **kw)


def test_an_output_inside_its_input_is_left_out_and_a_rerun_keeps_the_finished_manifest(corpus, sp_model, caplog):
    out = corpus / "shards"
    first = run(_settings([corpus], out, sp_model))
    finished = tree_bytes(out)
    assert first["totals"]["documents"] == 20 and first["totals"]["rejected"] == {}
    for _ in range(3):  # each rerun used to delete manifest.json, or read plan.json & co. as (rejected) input
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="data_prep"):
            again = run(_settings([corpus], out, sp_model))
        assert again == first
        assert tree_bytes(out) == finished
        said = [r.getMessage() for r in caplog.records if "is inside the input" in r.getMessage()]
        assert said == [f"data_prep: the output {out} is inside the input {corpus}: its files (shards, manifest, "
                        "logs) are not read as input"]
    # a glob over the input is filtered the same way (rejects.jsonl would match it)
    again = run(_settings([f"{corpus}/**/*.jsonl"], corpus / "shards2", sp_model))
    assert again["totals"]["documents"] == 20 and again["totals"]["rejected"] == {}


def test_an_input_that_is_the_output_is_refused_before_anything_is_written(corpus, sp_model):
    before = tree_bytes(corpus)
    with pytest.raises(PlanError, match=rf"input {corpus} is the output directory -o {corpus}: .* write to a "
                                        r"directory outside the input \(e\.g\. -o .*-shards"):
        run(_settings([corpus], corpus, sp_model))
    assert tree_bytes(corpus) == before


def test_another_tokenize_output_under_an_input_is_skipped_and_naming_one_is_refused(corpus, tmp_path, sp_model):
    run(_settings([corpus / "a.jsonl"], corpus / "old_shards", sp_model))
    m = run(_settings([corpus], tmp_path / "elsewhere", sp_model))
    assert m["totals"]["documents"] == 20 and m["totals"]["rejected"] == {}  # a.jsonl and b.jsonl only
    with pytest.raises(PlanError, match=r"is a `data_prep tokenize` output \(shards and a manifest, not documents\): "
                                        "give the inputs it was made from"):
        run(_settings([corpus / "old_shards"], tmp_path / "o2", sp_model))


@pytest.mark.parametrize("change, named", [
    ({"text_field": "body"}, "text_field (--text-field): text -> body"),
    ({"shard_size": 5_000}, "shard_size (--shard-size): 20000 -> 5000"),
    ({"append_eod": False}, "append_eod (--no-eod): True -> False"),
    ({"tokenizer": "other"}, "tokenizer (-t): "),
], ids=["text-field", "shard-size", "no-eod", "tokenizer"])
def test_a_rerun_with_other_settings_is_refused_naming_the_change_and_overwrite(change, named, corpus, tmp_path,
                                                                              sp_model, sp_model_nfkc):
    out = tmp_path / "out"
    run(_settings([corpus], out, sp_model))
    finished = tree_bytes(out)
    change = {**change, "tokenizer": sp_model_nfkc} if "tokenizer" in change else change
    kw = {"tokenizer": sp_model, **change}
    tok = kw.pop("tokenizer")
    with pytest.raises(ValueError) as e:
        run(_settings([corpus], out, tok, **kw))
    msg = str(e.value)
    assert msg.startswith(f"{out} holds a finished run (manifest.json) made with other settings: {named}")
    assert msg.endswith("rerun with --overwrite to replace them, or choose another -o/--output")
    if "tokenizer" in change:
        assert f"{sp_model} (sha256 " in msg and f"-> {sp_model_nfkc} (sha256 " in msg
    assert tree_bytes(out) == finished  # nothing touched: not the manifest, not a shard

    replaced = run(_settings([corpus], out, tok, overwrite=True, **kw))
    on_disk = json.load(open(out / "manifest.json"))
    assert on_disk == replaced and on_disk["settings"] != json.loads(finished["manifest.json"])["settings"]
    listed = {sh["prefix"] for sh in on_disk["shards"] + on_disk["empty_units"]}
    left = {n.split(".")[0] for n in os.listdir(out) if n.startswith("shard_")}
    assert left == listed  # the old run's shards the new plan does not write are gone with it


def test_the_cli_refuses_in_one_line_and_exit_2(corpus, tmp_path, sp_model, capsys):
    out = tmp_path / "out"
    run(_settings([corpus], out, sp_model))
    r = cli_here(capsys, "tokenize", corpus, "-o", out, "-t", sp_model, "-j", "1", "-q", "--shard-size", "8000")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert [x for x in r.stderr.splitlines() if x.startswith("error:")] == [
        f"error: {out} holds a finished run (manifest.json) made with other settings: shard_size (--shard-size): "
        "20000 -> 8000. This run would replace its shards: rerun with --overwrite to replace them, or choose another "
        "-o/--output"]


def test_train_tokenizer_keeps_a_different_existing_model_unless_overwrite(tmp_path, corpus_dir):
    from data_prep.steps.train_tokenizer import train

    src, prefix = [str(corpus_dir / "stdlib.jsonl")], str(tmp_path / "tok")
    kw = dict(quiet=True, sample_bytes=200_000)
    train(src, prefix, vocab_size=600, **kw)
    model = open(prefix + ".model", "rb").read()
    mtime = os.stat(prefix + ".model").st_mtime_ns
    train(src, prefix, vocab_size=600, **kw)  # identical: fine, the file left as it is
    assert os.stat(prefix + ".model").st_mtime_ns == mtime
    with pytest.raises(ValueError, match=r"tok\.model exists and differs from the tokenizer trained now .* rerun "
                                         "with --overwrite to replace it"):
        train(src, prefix, vocab_size=700, **kw)
    assert open(prefix + ".model", "rb").read() == model
    assert sorted(os.listdir(tmp_path)) == ["tok.model", "tok.vocab"]  # the new one discarded, no temporary left
    train(src, prefix, vocab_size=700, overwrite=True, **kw)
    assert open(prefix + ".model", "rb").read() != model


def test_merge_keeps_a_finished_output_of_other_sources_unless_overwrite(corpus, tmp_path, sp_model):
    from data_prep.write.merge import merge

    a, b = tmp_path / "a", tmp_path / "b"
    run(_settings([corpus / "a.jsonl"], a, sp_model))
    run(_settings([corpus / "b.jsonl"], b, sp_model))
    out = tmp_path / "merged"
    merge([str(a), str(b)], str(out), 1 << 30, quiet=True)
    finished = tree_bytes(out)
    merge([str(a), str(b)], str(out), 1 << 30, quiet=True)  # the same merge again: the same bytes
    assert tree_bytes(out) == finished
    with pytest.raises(ValueError, match="holds a finished output .* rerun with --overwrite"):
        merge([str(a)], str(out), 1 << 30, quiet=True)
    assert tree_bytes(out) == finished
    with pytest.raises(ValueError, match="is one of the sources"):
        merge([str(a), str(b)], str(a), 1 << 30, quiet=True)
    assert merge([str(a)], str(out), 1 << 30, quiet=True, overwrite=True)["settings"]["merged_from"] == [str(a)]

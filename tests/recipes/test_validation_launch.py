"""`validate_for_launch`: every recipe and data mistake found before anything starts, each named by its field or
file with the fix (the messages asserted); `recipes render` refuses the same. The proof that `recipes train` refuses
before any rank exists is tests/recipes/test_validation_prespawn.py (it starts a process)."""
import json
from pathlib import Path

import pytest

from recipes.config.loading import load_recipe
from recipes.planner.validation import launch_refusal, validate_for_launch
from recipes.tools import render

pytestmark = pytest.mark.unit

TINY = "configs/runs/tiny-cpu.yaml"  # model.vocab_size 320; 6 steps on the CPU cluster


def write_manifest(d: Path, vocab: int = 257, shards: int = 1, files: bool = True, **extra) -> Path:
    """A data_prep-shaped manifest.json (its shard files empty: the launch checks look for them only)."""
    d.mkdir(parents=True, exist_ok=True)
    entries = [{"prefix": f"shard_{i:06d}", "tokens": 100} for i in range(shards)]
    for e in entries if files else []:
        for ext in (".bin", ".idx"):
            (d / (e["prefix"] + ext)).write_bytes(b"")
    path = d / "manifest.json"
    path.write_text(json.dumps({"tokenizer": {"vocab_size": vocab, "eod_id": 256}, "dtype": "uint16",
                                "shards": entries, **extra}))
    return path


def problems(tmp_path, *overrides, config=TINY, world=1):
    recipe = load_recipe(config, [f"checkpoint.dir={tmp_path / 'ck'}", *overrides])
    return validate_for_launch(recipe, world)


def one(tmp_path, *overrides, **kw):
    found = problems(tmp_path, *overrides, **kw)
    assert len(found) == 1, found
    return found[0]


def test_a_complete_recipe_has_no_problem(tmp_path):
    assert problems(tmp_path, f"data.manifests=[{write_manifest(tmp_path / 'd')}]") == []


def test_no_data(tmp_path):
    p = one(tmp_path)
    assert p.field == "data.manifests"
    assert str(p) == ("data: the recipe names no training data (data.manifests, data.blend and data.stages are all "
                      "empty); set data.manifests=[DIR/manifest.json], the manifest that `python -m data_prep "
                      "tokenize INPUTS -o DIR -t TOKENIZER` writes")


def test_missing_manifest_names_the_path_and_the_command(tmp_path):
    gone = tmp_path / "corpus" / "manifest.json"
    p = one(tmp_path, f"data.manifests=[{gone}]")
    assert str(p) == (f"data.manifests[0] = {gone}: {gone} not found; build it with `python -m data_prep tokenize "
                      f"INPUTS -o {tmp_path / 'corpus'} -t TOKENIZER`, or fix the path")
    # a directory entry means its manifest.json
    assert f"{tmp_path / 'x' / 'manifest.json'} not found" in str(one(tmp_path, f"data.manifests=[{tmp_path / 'x'}]"))


def test_unfinished_data_prep_run_says_how_to_finish_it(tmp_path):
    out = tmp_path / "shards"
    out.mkdir()
    inputs = [tmp_path / "raw" / "a.jsonl", tmp_path / "raw" / "b.jsonl"]
    for i, path in enumerate(inputs):
        (out / f"shard_{i:06d}.stats.json").write_text(json.dumps({"inputs": [{"path": str(path), "kind": "jsonl"}]}))
    (out / "failed_units.json").write_text("[]")
    p = one(tmp_path, f"data.manifests=[{out}]")
    assert (f"{out / 'manifest.json'} not found; 2 unit(s) of a data_prep run are complete there but it wrote no "
            f"manifest ({out / 'failed_units.json'} lists the units that failed)") in str(p)
    assert p.fix == (f"finish the run: `python -m data_prep tokenize {inputs[0]} {inputs[1]} -o {out} -t TOKENIZER` "
                     "(completed units are skipped)")


def test_corrupt_manifest_names_the_file_line_and_column(tmp_path):
    bad = tmp_path / "corpus" / "manifest.json"
    bad.parent.mkdir()
    bad.write_text('{"tokenizer": {"vocab_size": 257,, }')
    p = one(tmp_path, f"data.manifests=[{bad}]")
    assert str(p) == (f"data.manifests[0]: {bad}:1:34: not valid JSON (Expecting property name enclosed in double "
                      f"quotes); rewrite it: `python -m data_prep tokenize INPUTS -o {bad.parent} -t TOKENIZER` "
                      "(completed units are kept)")
    bad.write_text("[1, 2]")
    assert "is not a data_prep manifest" in str(one(tmp_path, f"data.manifests=[{bad}]"))
    bad.write_text('{"shards": []}')
    assert "has no tokenizer record with vocab_size and eod_id" in str(one(tmp_path, f"data.manifests=[{bad}]"))


def test_empty_manifest_says_why_it_is_empty(tmp_path):
    m = write_manifest(tmp_path / "e", shards=0,
                       totals={"documents": 0, "rejected": {"missing_text": 40, "empty_text": 2}})
    p = one(tmp_path, f"data.manifests=[{m}]")
    assert str(p).startswith(f"data.manifests[0]: {m} holds no shards (0 documents; 42 record(s) rejected, most for "
                             "'missing_text'); tokenize data that yields documents (a wrong --text-field rejects every "
                             "record as missing_text")


def test_missing_shard_files(tmp_path):
    m = write_manifest(tmp_path / "n", shards=5, files=False)
    p = one(tmp_path, f"data.manifests=[{m}]")
    assert (f"data.manifests[0]: 5 of the 5 shards {m} lists lack their .bin/.idx (shard_000000, shard_000001, "
            f"shard_000002 and 2 more, under {tmp_path / 'n'})") in str(p)
    assert "copy them back, or rebuild" in p.fix


def test_tokenizer_vocabulary_must_fit_the_model(tmp_path):
    m = write_manifest(tmp_path / "v", vocab=32000)
    p = one(tmp_path, f"data.manifests=[{m}]")
    assert p.field == "model.vocab_size"
    assert str(p).startswith(f"model.vocab_size = 320 is smaller than the vocabulary of the tokenizer {m} was "
                             "written with (32000 ids): token ids >= 320 have no embedding; set model.vocab_size=32000")


def test_manifests_of_two_tokenizers(tmp_path):
    a, b = write_manifest(tmp_path / "a"), write_manifest(tmp_path / "b", vocab=300)
    p = one(tmp_path, f"data.manifests=[{a},{b}]")
    assert f"the tokenizer of {b} (vocabulary 300, end-of-document 256) differs from that of {a}" in str(p)


def test_no_train_length(tmp_path):
    p = one(tmp_path, f"data.manifests=[{write_manifest(tmp_path / 'd')}]", "training.train_steps=null")
    assert p.field == "training.train_tokens"
    assert str(p).startswith("training: the recipe sets no train length (training.train_tokens and "
                             "training.train_steps are both empty); set training.train_tokens=N")


def test_no_checkpoint_dir_on_a_long_run_unless_opted_out(tmp_path):
    m = write_manifest(tmp_path / "d")
    recipe = load_recipe(TINY, [f"data.manifests=[{m}]", "training.train_steps=3000000"])
    p, = validate_for_launch(recipe, 1)
    assert p.field == "checkpoint.dir"
    assert str(p).startswith("checkpoint.dir: not set, and this run is predicted to take ")
    assert "3,000,000 steps x " in str(p) and "checkpoint.require_dir=false" in p.fix
    assert validate_for_launch(load_recipe(TINY, [f"data.manifests=[{m}]", "training.train_steps=3000000",
                                                  "checkpoint.require_dir=false"]), 1) == []
    assert validate_for_launch(load_recipe(TINY, [f"data.manifests=[{m}]"]), 1) == []  # 6 steps: seconds
    # a big run on its GPU cluster: the documented 70B quickstart, 2e12 tokens
    big = load_recipe("configs/runs/llama-70b-16x8-h100.yaml", [f"data.manifests=[{write_manifest(tmp_path / 'l', 32000)}]",
                                                                "checkpoint.dir=null"])
    p, = validate_for_launch(big)
    # priced with the H100 calibration (configs/clusters/calibration/h100.yaml), as `recipes plan` prices it
    assert "this run is predicted to take 183.7 days (476,838 steps x 33.29 s at TP=2 x PP=16 x DP=4" in str(p)


def test_export_tokenizer_path_and_blends_and_stages(tmp_path):
    m = write_manifest(tmp_path / "d")
    p = one(tmp_path, f"data.manifests=[{m}]", f"data.tokenizer={tmp_path / 'tok.model'}")
    assert str(p).startswith(f"data.tokenizer = {tmp_path / 'tok.model'}: not found; point it at the tokenizer")
    p = one(tmp_path, f"data.manifests=[{m}]", f"data.blend=[[1.0,{tmp_path / 'gone' / 'shard'}]]")
    assert f"data.blend: 1 of the 1 shards data.blend lists lack their .bin/.idx (shard, under {tmp_path / 'gone'})" \
        in str(p)
    assert p.fix == f"copy them back, or rebuild: `python -m data_prep tokenize INPUTS -o {tmp_path / 'gone'} -t TOKENIZER`"
    lone = problems(tmp_path, f"data.blend=[[1.0,{tmp_path / 'd' / 'shard_000000'}]]")
    assert [str(x) for x in lone] == ["data.blend is given without manifests: the tokenizer's end-of-document id is "
                                      "unknown; add the manifest the prefixes come from to data.manifests"]
    p = one(tmp_path, f"data.stages=[{{name: web, manifests: [{tmp_path / 'web'}]}}]")
    assert str(p).startswith(f"data.stages.0 (web).manifests[0] = {tmp_path / 'web'}: "
                             f"{tmp_path / 'web' / 'manifest.json'} not found")
    p = one(tmp_path, "data.manifests=[s3://bucket/corpus/manifest.json]")
    assert "training reads manifests from a file system" in str(p)


def test_every_problem_is_listed_at_once_with_the_layout_rules(tmp_path):
    found = problems(tmp_path, "training.train_steps=null", "parallel.tp=3", world=2)
    text = launch_refusal(load_recipe(TINY), found)
    assert text.startswith("recipe 'tiny-cpu' cannot start: 6 problem(s):\n  - ")
    for part in ("world size 2 (the ranks launched)", "num_attention_heads=4 is not divisible by parallel.tp=3",
                 "ffn_hidden_size=128 is not divisible by parallel.tp=3", "sets no train length",
                 "names no training data"):
        assert part in text, part


def test_render_refuses_what_a_launch_would_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    rc = render.main([TINY, "training.train_steps=null", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.startswith("error: recipe 'tiny-cpu' cannot start: 2 problem(s):")
    assert "names no training data" in err and "sets no train length" in err
    # --layout-only: the layout and memory only, for a recipe whose data is still to come
    assert render.main([TINY, "--out", str(out), "--layout-only", "-q"]) == 0
    assert (out / "ds_config.json").is_file()
    m = write_manifest(tmp_path / "d")
    assert render.main([TINY, f"data.manifests=[{m}]", "--out", str(tmp_path / "ok"), "-q"]) == 0

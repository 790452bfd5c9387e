"""`blend` weights and `train-tokenizer` vocabulary sizes are checked with the fix (issue 22 item 4): exit 2, one
line naming the source or the size that works. The vocabulary limits are sentencepiece's own: the size each message
names is then trained with, and must work."""

import json

import pytest
import sentencepiece as spm
from tests.support.data_prep import run_cli, write_jsonl


def _manifest(d, tokens=(100, 300), sha="tok-a"):
    """A hand-written manifest.json (what `blend` reads): shards with their token counts, and a tokenizer."""
    d.mkdir()
    shards = [{"prefix": f"shard_{i:06d}", "tokens": t} for i, t in enumerate(tokens)]
    (d / "manifest.json").write_text(json.dumps({"shards": shards, "totals": {"tokens": sum(tokens)},
                                                 "tokenizer": {"path": f"/tok/{sha}.model", "sha256": sha}}))
    return d


@pytest.fixture
def sources(tmp_path):
    return _manifest(tmp_path / "web"), _manifest(tmp_path / "code", (50,))


def _blend(capsys, *args):
    from data_prep.cli import main

    rc = main(["blend", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err.strip()


@pytest.mark.unit
@pytest.mark.parametrize("specs, message", [
    (["web={web}:0.7x", "code={code}:0.3"], "error: blend: the weight '0.7x' of web (web={web}:0.7x) is not a "
                                            "number; write name=DIR:weight, e.g. web=out/web:0.7"),
    (["web={web}:-0.3", "code={code}:1"], "error: blend: the weight of web is -0.3; weights are shares of the "
                                          "training tokens, finite and >= 0"),
    (["web={web}:nan", "code={code}:1"], "error: blend: the weight of web is nan"),
    (["web={web}:0", "code={code}:0"], "error: blend: the weights sum to 0; give the sources positive weights"),
    (["web={web}:0", "code={code}:1"], "error: blend: web has weight 0; leave it out of the blend instead"),
    (["web={web}:0.7", "code={code}"], "error: blend: code has no weight while other sources do (it would weigh "
                                       "1.0 next to them): give every source a weight (name=DIR:weight), or none"),
    (["x={web}:0.5", "x={code}:0.5"], "error: blend: the source name x is given twice"),
])
def test_bad_blend_weights_are_refused_with_the_fix(capsys, sources, specs, message):
    web, code = sources
    rc, out, err = _blend(capsys, *[s.format(web=web, code=code) for s in specs])
    assert rc == 2 and out == ""
    assert err.startswith(message.format(web=web, code=code)), err


@pytest.mark.unit
def test_an_empty_source_or_a_second_tokenizer_is_refused(capsys, tmp_path, sources):
    web, _ = sources
    empty = _manifest(tmp_path / "empty", ())
    rc, _, err = _blend(capsys, f"web={web}:0.5", f"empty={empty}:0.5")
    assert rc == 2 and err.startswith(f"error: blend: empty ({empty}) has no documents (0 shards); its weight would "
                                      "silently go to the other sources")
    other = _manifest(tmp_path / "other", (10,), sha="tok-b")
    rc, _, err = _blend(capsys, f"web={web}:0.5", f"other={other}:0.5")
    assert rc == 2 and err == (f"error: blend: other ({other}) was tokenized with /tok/tok-b.model but web with "
                               "/tok/tok-a.model; a blend needs one tokenizer: re-tokenize one of them")


@pytest.mark.unit
def test_good_weights_still_blend_by_share_then_tokens(capsys, tmp_path, sources):
    web, code = sources
    rc, out, _ = _blend(capsys, f"web={web}:3", f"code={code}:1", "-o", tmp_path / "b.json")
    assert rc == 0
    blend = json.load(open(tmp_path / "b.json"))["blend"]
    # by hand: web 3/4 split 100:300 over its shards, code 1/4 on its one shard
    assert blend[0::2] == pytest.approx([0.75 * 100 / 400, 0.75 * 300 / 400, 0.25])
    assert blend[1::2] == [str(web / "shard_000000"), str(web / "shard_000001"), str(code / "shard_000000")]


def _sp_error(r) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    return r.stderr.strip()


@pytest.mark.multiproc
def test_vocab_too_small_names_the_smallest_size_that_trains(tmp_path, corpus_dir):
    corpus = corpus_dir / "stdlib.jsonl"
    base = ["train-tokenizer", corpus, "--sample-bytes", "100K", "-q"]
    err = _sp_error(run_cli(*base, "-o", tmp_path / "a", "--vocab-size", "100", check=False))
    assert err == ("error: --vocab-size 100 is too small: byte fallback needs 256 byte pieces plus 4 specials "
                   "(<unk> <s> </s> <pad>) plus the sample's characters; use at least 261 (a few hundred more in "
                   "practice; e.g. 32000)")
    err = _sp_error(run_cli(*base, "-o", tmp_path / "b", "--vocab-size", "280", check=False))
    assert err.startswith("error: --vocab-size 280 is too small for this sample: 256 byte pieces, 4 specials and "
                          "the ")
    need = int(err.rsplit("use --vocab-size ", 1)[1].split()[0])
    assert need > 280 and f"need at least {need}" in err
    assert not list(tmp_path.glob("b*"))  # no partial model left
    _sp_error(run_cli(*base, "-o", tmp_path / "c", "--vocab-size", str(need - 1), check=False))
    model = run_cli(*base, "-o", tmp_path / "d", "--vocab-size", str(need)).stdout.strip()
    assert spm.SentencePieceProcessor(model_file=model).get_piece_size() == need


@pytest.mark.multiproc
def test_vocab_larger_than_the_sample_gives_names_the_largest_that_trains(tmp_path, corpus_dir):
    corpus = corpus_dir / "stdlib.jsonl"
    base = ["train-tokenizer", corpus, "--sample-bytes", "30K", "-q"]
    err = _sp_error(run_cli(*base, "-o", tmp_path / "a", "--vocab-size", "30000", check=False))
    assert err.startswith("error: --vocab-size 30000 is more than this sample can give: its ")
    most = int(err.split("yield at most ", 1)[1].split()[0])
    assert f"use --vocab-size {most} or less, or a bigger sample (--sample-bytes, more input files)" in err
    model = run_cli(*base, "-o", tmp_path / "b", "--vocab-size", str(most)).stdout.strip()
    assert spm.SentencePieceProcessor(model_file=model).get_piece_size() == most


@pytest.mark.multiproc
def test_train_tokenizer_refuses_a_sample_without_the_text_field(tmp_path):
    src = write_jsonl(tmp_path / "s.jsonl", [{"body": f"document {i} " * 30} for i in range(10)])
    err = _sp_error(run_cli("train-tokenizer", src, "-o", tmp_path / "sp", check=False))
    assert "no field 'text' (--text-field text)" in err and err.endswith("rerun with --text-field body")
    assert not list(tmp_path.glob("sp*"))

"""tiktoken gives each tokenizer family the library's own ids, or is not used (refused at build, or at self-check)."""

import functools
import json

import pytest
import sentencepiece as spm
from tests.support.data_prep import TRICKY, train_byte_level_bpe

from data_prep.steps.fast_path import FastEncoder
from data_prep.steps.tiktoken_bpe import ByteLevelTiktoken, SentencePieceTiktoken
from data_prep.steps.tokenizers import load_tokenizer

pytestmark = pytest.mark.unit

# On top of TRICKY: empty documents, whitespace runs, emoji and CJK runs, very long words, characters no vocabulary
# has (private use, noncharacters: byte fallback), decomposed and compatibility forms (normalization).
EDGE = ["", " ", "\n", "\t \t\n\n   \r\n", "▁", "▁▁ ▁", " ▁x", "😀" * 40 + " 👍🏽👨‍👩‍👧", "漢字かなカナ한국어" * 50,
        "x" * 30_000, "ab" * 20_000 + " " + "1" * 5_000, "\ue000\uffff\U0010fffd\U0001f600", "e\u0301 é Å Å ﬀ ①",
        "ＡＢＣ１２３　ｱｲｳ", " " * 3000 + "end", "mixed\u00a0nbsp\u2028line\u2029para", "Straße İstanbul ǅ"]


def _library_ids(path, docs):
    """The library's own ids for `docs` (copies: several tests of a worker compare against the same reference, which
    is computed once per tokenizer and document list)."""
    return [list(ids) for ids in _library_ids_once(str(path), tuple(docs))]


@functools.lru_cache(maxsize=32)
def _library_ids_once(path, docs):
    if path.endswith(".json"):
        from tokenizers import Tokenizer

        return [e.ids for e in Tokenizer.from_file(path).encode_batch(list(docs), add_special_tokens=False)]
    return spm.SentencePieceProcessor(model_file=path).encode(list(docs))


def _docs(texts):
    paras = [p for t in texts[:80] for p in t.split("\n\n")][:300]
    return texts + paras + TRICKY + EDGE


@pytest.mark.parametrize("model", ["sp_model", "sp_model_nfkc", "sp_model_nfkc_cf", "hf_bpe", "hf_llama3_style"])
def test_every_family_runs_on_tiktoken_with_the_library_ids(model, texts, request):
    path = request.getfixturevalue(model)
    enc = FastEncoder(load_tokenizer(path), gigatoken=False)
    assert enc.method == "tiktoken", enc.describe()
    docs = _docs(texts)
    enc.self_check(docs[:20])
    assert enc.method == "tiktoken", enc.describe()
    got = [a.tolist() for i in range(0, len(docs), 64) for a in enc.encode_arrays(docs[i : i + 64])]
    want = _library_ids(path, docs)
    bad = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    assert not bad, [docs[i][:60] for i in bad[:3]]
    assert got[docs.index("")] == []


def test_special_token_written_in_a_text_goes_to_the_library(hf_bpe):
    enc = FastEncoder(load_tokenizer(hf_bpe), gigatoken=False)
    assert enc.method == "tiktoken"
    docs = ["before <|endoftext|> after", "plain"]
    assert [a.tolist() for a in enc.encode_arrays(docs)] == _library_ids(hf_bpe, docs)
    assert enc.tok.info.eod_id in enc.encode_arrays(docs)[0].tolist()


def _edited(src, tmp_path, name, edit):
    cfg = json.load(open(src))
    edit(cfg)
    out = tmp_path / name
    out.write_text(json.dumps(cfg))
    return str(out)


def test_tiktoken_refuses_when_merges_or_regex_differ(hf_bpe, texts, tmp_path):
    def swap_merges(cfg):  # two merges in the other order: the library's priority no longer follows the ids
        m = cfg["model"]["merges"]
        m[10], m[200] = m[200], m[10]

    def other_regex(cfg):  # a Split that removes what it matches: not one isolated regex
        cfg["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}

    def digits(cfg):
        cfg["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, cfg["pre_tokenizer"]]}

    for name, edit, why in (("swap.json", swap_merges, "merge order"), ("removed.json", other_regex, "isolated"),
                            ("digits.json", digits, "pre-tokenizer")):
        path = _edited(hf_bpe, tmp_path, name, edit)
        tok = load_tokenizer(path)
        built, reason = ByteLevelTiktoken.build(tok.tok)
        assert built is None and why in reason, reason
        enc = FastEncoder(tok, gigatoken=False)
        assert enc.method != "tiktoken" and why in enc.describe()
        docs = texts[:20] + TRICKY + EDGE
        assert enc.encode_batch(docs) == _library_ids(path, docs)


def test_tiktoken_mismatch_at_self_check_falls_back_to_the_piece_cache(hf_bpe, sp_model, texts):
    import tiktoken

    for path in (hf_bpe, sp_model):
        enc = FastEncoder(load_tokenizer(path), gigatoken=False)
        assert enc.method == "tiktoken"
        old = enc.tiktoken.encoding  # same ranks, every character its own piece: ids differ on real text
        enc.tiktoken.encoding = tiktoken.Encoding("wrong", pat_str=r"(?s:.)", mergeable_ranks=old._mergeable_ranks,
                                                  special_tokens={})
        docs = texts[:20] + TRICKY
        enc.self_check(docs)
        assert enc.method == "piece cache" and "self-check mismatch" in enc.describe()
        assert enc.encode_batch(docs) == _library_ids(path, docs)


def test_unigram_is_refused(sp_model_unigram):
    built, reason = SentencePieceTiktoken.build(spm.SentencePieceProcessor(model_file=sp_model_unigram), str)
    assert built is None and "BPE" in reason
    assert FastEncoder(load_tokenizer(sp_model_unigram)).method == "library"

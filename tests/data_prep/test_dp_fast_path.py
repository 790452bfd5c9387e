"""The fast path (cache of whitespace-delimited pieces) gives the library's own ids, or is not used.

These tests turn tiktoken off (``enc.tiktoken = enc.gigatoken = None``) so the piece cache is what runs; test_dp_tiktoken.py covers
tiktoken."""

import numpy as np
import pytest
import sentencepiece as spm
from tests.support.data_prep import TRICKY, read_all_docs, write_jsonl

from data_prep.pipeline import Settings, run
from data_prep.steps.fast_path import FastEncoder, FastPathMismatch
from data_prep.steps.tokenizers import load_tokenizer

pytestmark = pytest.mark.unit


def _docs(texts):
    # real stdlib text, its paragraphs (many repeated pieces, so the cache is exercised) and the tricky cases
    paras = [p for t in texts for p in t.split("\n\n")][:400]
    return texts + paras + TRICKY


@pytest.mark.parametrize("model", ["sp_model", "sp_model_nfkc"])
def test_sentencepiece_fast_path_is_identical(model, texts, request):
    path = request.getfixturevalue(model)
    tok = load_tokenizer(path)
    enc = FastEncoder(tok, max_cache=500, gigatoken=False)  # small cache: clearing mid-stream must not change ids
    enc.tiktoken = enc.gigatoken = None
    assert enc.active, enc.reason
    docs = _docs(texts)
    sp = spm.SentencePieceProcessor(model_file=path)
    got = []
    for i in range(0, len(docs), 64):
        got += enc.encode_batch(docs[i : i + 64])
    assert got == sp.encode(docs)
    assert len(enc.cache) > 0


def test_unigram_is_not_fast_pathed_but_encodes_the_same(sp_model_unigram, texts):
    enc = FastEncoder(load_tokenizer(sp_model_unigram))
    assert not enc.active and "unigram" in enc.reason
    sp = spm.SentencePieceProcessor(model_file=sp_model_unigram)
    assert enc.encode_batch(texts[:5]) == sp.encode(texts[:5])


def test_llama_style_settings_are_the_ones_tested(sp_model):
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.ParseFromString(open(sp_model, "rb").read())
    assert m.normalizer_spec.name == "identity" and not m.normalizer_spec.remove_extra_whitespaces
    assert m.trainer_spec.split_digits and m.trainer_spec.byte_fallback and m.normalizer_spec.add_dummy_prefix


def test_hf_byte_level_bpe_fast_path_is_identical(hf_bpe, texts):
    from tokenizers import Tokenizer

    enc = FastEncoder(load_tokenizer(hf_bpe), max_cache=500, gigatoken=False)
    enc.tiktoken = enc.gigatoken = None
    assert enc.active, enc.reason
    docs = _docs(texts)
    ref = Tokenizer.from_file(hf_bpe)
    want = [e.ids for e in ref.encode_batch(docs, add_special_tokens=False)]
    got = []
    for i in range(0, len(docs), 64):
        got += enc.encode_batch(docs[i : i + 64])
    assert got == want


def test_not_exact_tokenizers_fall_back(tmp_path, hf_bpe, texts):
    from tokenizers import Tokenizer, normalizers, pre_tokenizers

    tok = Tokenizer.from_file(hf_bpe)
    tok.normalizer = normalizers.Lowercase()
    p1 = tmp_path / "norm.json"
    tok.save(str(p1))
    enc = FastEncoder(load_tokenizer(str(p1)), gigatoken=False)
    assert not enc.active and "normalizer" in enc.reason
    assert enc.encode_batch(texts[:3]) == [e.ids for e in tok.encode_batch(texts[:3], add_special_tokens=False)]

    tok = Tokenizer.from_file(hf_bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    p2 = tmp_path / "prefix.json"
    tok.save(str(p2))
    assert not FastEncoder(load_tokenizer(str(p2)), gigatoken=False).active


def test_self_check_disables_a_wrong_fast_path(sp_model, texts):
    enc = FastEncoder(load_tokenizer(sp_model), gigatoken=False)
    enc.tiktoken = enc.gigatoken = None
    enc.splitter.runs = not enc.splitter.runs  # simulate a wrong decision about the model's settings
    enc.self_check(texts[:20] + TRICKY)
    assert not enc.active and "self-check" in enc.reason


def test_pipeline_with_and_without_fast_path_and_verify_fraction(tmp_path, texts, sp_model):
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in _docs(texts)[:200]])
    outs = []
    for name, fast in (("fast", True), ("slow", False)):
        out = tmp_path / name
        run(Settings(inputs=[str(tmp_path / "a.jsonl")], output_dir=str(out), tokenizer=sp_model, fast_path=fast,
                     verify_fraction=0.5, quiet=True))
        outs.append(read_all_docs(out)[1])
    assert outs[0] == outs[1]


def test_verify_fraction_stops_on_a_mismatch(tmp_path, texts, sp_model, monkeypatch):
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts[:10]])
    orig = FastEncoder.encode_flat

    def broken(self, batch):  # every document loses its last id
        flat, offsets = orig(self, batch)
        if not self.active:
            return flat, offsets
        lengths = np.maximum(np.diff(offsets) - 1, 0)
        keep = np.concatenate([flat[a : a + n] for a, n in zip(offsets[:-1], lengths)])
        return keep, np.concatenate([[0], np.cumsum(lengths)])

    monkeypatch.setattr(FastEncoder, "encode_flat", broken)
    monkeypatch.setattr(FastEncoder, "self_check", lambda self, texts: None)
    with pytest.raises(FastPathMismatch):
        run(Settings(inputs=[str(tmp_path / "a.jsonl")], output_dir=str(tmp_path / "o"), tokenizer=sp_model,
                     verify_fraction=0.1, quiet=True))
    assert not (tmp_path / "o" / "manifest.json").exists() and not list((tmp_path / "o").glob("*.bin"))


@pytest.mark.parametrize("model", ["sp_model", "sp_model_nfkc"])
def test_second_level_cut_is_used_and_identical(model, texts, request):
    """Texts are cut into letter / digit / other runs where the vocabulary allows it (decided from its pieces)."""
    path = request.getfixturevalue(model)
    enc = FastEncoder(load_tokenizer(path), max_cache=300, gigatoken=False)
    enc.tiktoken = enc.gigatoken = None
    assert enc.active and enc.splitter.fine is not None
    docs = _docs(texts)
    got = []
    for i in range(0, len(docs), 32):
        got += enc.encode_batch(docs[i : i + 32])
    assert got == spm.SentencePieceProcessor(model_file=path).encode(docs)
    assert 0 < len(enc.cache) + len(enc.old)


def _library_ids(path, docs):
    if path.endswith(".json"):
        from tokenizers import Tokenizer

        return [e.ids for e in Tokenizer.from_file(path).encode_batch(docs, add_special_tokens=False)]
    return spm.SentencePieceProcessor(model_file=path).encode(docs)


@pytest.mark.parametrize("model,coarse", [("sp_model", False), ("sp_model", True), ("sp_model_nfkc", False),
                                          ("sp_model_nfkc", True), ("hf_bpe", False)])
def test_documents_cut_into_parts_give_the_same_ids(model, coarse, texts, request):
    """Long documents are pieced part by part (memory flat whatever the longest document), cut only where a piece
    starts whatever the text around. With parts of ~40 characters (many cuts in every document) the ids are still
    the library's, for the fine (letter/digit/other) and the coarse (word) cut."""
    path = request.getfixturevalue(model)
    enc = FastEncoder(load_tokenizer(path), max_cache=300, gigatoken=False)
    assert enc.active, enc.reason
    if coarse:
        enc.splitter.fine = None
    enc.tiktoken = enc.gigatoken = None  # the piece cache is what is cut into parts (tiktoken encodes documents whole)
    enc.SEGMENT_CHARS = 40
    # a quarter of the corpus: with 40-character parts that is already thousands of cuts
    docs = _docs(texts[: len(texts) // 4]) + ["   ", " a", "a ", "\u2581", " \u2581 ", "a \u2581 b  c" * 30]
    prepared = enc.splitter.prepare(docs)
    cuts = sum(1 for d in prepared if d is not None for _ in enc.splitter.cut_points(d, 40))
    assert cuts > 5 * len(docs), cuts
    got = [a.tolist() for i in range(0, len(docs), 16) for a in enc.encode_arrays(docs[i : i + 16])]
    assert got == _library_ids(path, docs)

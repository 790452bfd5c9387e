"""Shared fixtures for data_prep tests: real text, a tiny sentencepiece model, a tiny byte-level BPE (trained here)."""

import orjson
import pytest

from tests.support.data_prep import TRICKY, train_byte_level_bpe


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    from data_prep.tools.sample_corpus import build

    d = tmp_path_factory.mktemp("corpus")
    build(str(d), 600_000)
    return d


@pytest.fixture(scope="session")
def texts(corpus_dir):
    with open(corpus_dir / "stdlib.jsonl", "rb") as f:
        real = [orjson.loads(line)["text"] for line in f]
    return real + TRICKY


def _train_sp(corpus_dir, tmp_path_factory, name, **kw):
    from data_prep.steps.train_tokenizer import train

    prefix = tmp_path_factory.mktemp("tok") / name
    return train([str(corpus_dir / "stdlib.jsonl")], str(prefix), vocab_size=800, quiet=True,
                 sample_bytes=300_000, **kw)


@pytest.fixture(scope="session")
def sp_model(corpus_dir, tmp_path_factory):
    """Llama-style: identity normalization, whitespace kept, split digits, byte fallback (train-tokenizer default)."""
    return _train_sp(corpus_dir, tmp_path_factory, "llama_style")


@pytest.fixture(scope="session")
def sp_model_nfkc(corpus_dir, tmp_path_factory):
    """Classic sentencepiece defaults: nmt_nfkc, whitespace collapsed, dummy prefix."""
    return _train_sp(corpus_dir, tmp_path_factory, "nfkc", normalization="nmt_nfkc")


@pytest.fixture(scope="session")
def sp_model_nfkc_cf(corpus_dir, tmp_path_factory):
    """NFKC with case folding, whitespace collapsed, dummy prefix."""
    return _train_sp(corpus_dir, tmp_path_factory, "nfkc_cf", normalization="nfkc_cf")


@pytest.fixture(scope="session")
def sp_model_unigram(corpus_dir, tmp_path_factory):
    return _train_sp(corpus_dir, tmp_path_factory, "unigram", model_type="unigram", normalization="nmt_nfkc")


@pytest.fixture(scope="session")
def hf_bpe(texts, tmp_path_factory):
    """A byte-level BPE (GPT-2 style pre-tokenizer) built and trained with the tokenizers library."""
    from tokenizers import pre_tokenizers

    return train_byte_level_bpe(texts, tmp_path_factory.mktemp("hf"), pre_tokenizers.ByteLevel(add_prefix_space=False),
                                800, "<|endoftext|>")


@pytest.fixture(scope="session")
def hf_llama3_style(texts, tmp_path_factory):
    """Byte-level BPE with Llama-3's pre-tokenizer: Split(its regex, Isolated) then ByteLevel without regex."""
    from tokenizers import Regex, pre_tokenizers

    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return train_byte_level_bpe(texts, tmp_path_factory.mktemp("hf3"), pre, 900, "<|end_of_text|>")

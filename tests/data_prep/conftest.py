"""Shared fixtures for data_prep tests: real text, a tiny sentencepiece model, a tiny byte-level BPE (trained here)."""

import os
import subprocess
import sys

import orjson
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# Texts that exercise normalization and whitespace handling on top of the real stdlib text.
TRICKY = [
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\nand  double  spaces",
    "ﬁne ligatures, ＦＵＬＬ width, ideographic\u3000space, ¨ diaeresis and e\u0301 combining",
    "digits 1234567890 and 3.14159, version 2.13.0",
    "emoji 😀 and CJK 漢字 and arabic مرحبا",
    "    def indented(self):\n        return {'a': [1, 2, 3]}\n",
    "▁ a literal meta symbol ▁▁ here",
    "x",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "<|endoftext|> special token written in text",
]


def run_cli(*args, check=True, timeout=180, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=REPO)
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-m", "data_prep", *map(str, args)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"data_prep {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}\n{r.stdout}")
    return r


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    from data_prep.sample_corpus import build

    d = tmp_path_factory.mktemp("corpus")
    build(str(d), 600_000)
    return d


@pytest.fixture(scope="session")
def texts(corpus_dir):
    with open(corpus_dir / "stdlib.jsonl", "rb") as f:
        real = [orjson.loads(line)["text"] for line in f]
    return real + TRICKY


def _train_sp(corpus_dir, tmp_path_factory, name, **kw):
    from data_prep.train_tokenizer import train

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
def sp_model_unigram(corpus_dir, tmp_path_factory):
    return _train_sp(corpus_dir, tmp_path_factory, "unigram", model_type="unigram", normalization="nmt_nfkc")


@pytest.fixture(scope="session")
def hf_bpe(texts, tmp_path_factory):
    """A byte-level BPE (GPT-2 style pre-tokenizer) built and trained with the tokenizers library."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts[:60], trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def write_jsonl(path, records):
    with open(path, "wb") as f:
        for r in records:
            f.write(orjson.dumps(r) + b"\n")
    return path


def read_all_docs(out_dir):
    """Every sequence of every shard in manifest order, as lists of ints, via megatron-core's reader."""
    import json

    from data_prep.shards import indexed_dataset_class

    IndexedDataset = indexed_dataset_class()
    m = json.load(open(os.path.join(out_dir, "manifest.json")))
    docs = []
    for sh in m["shards"]:
        ds = IndexedDataset(os.path.join(out_dir, sh["prefix"]))
        docs += [ds[i].tolist() for i in range(len(ds))]
        del ds
    return m, docs


def tree_bytes(d):
    out = {}
    for root, _, files in os.walk(d):
        for name in files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out

"""Helpers for the data_prep tests: tricky texts, the CLI in a subprocess, jsonl writing and shard reading."""

import os
import subprocess
import sys

import orjson

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

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


def run_cli(*args, check=True, timeout=180, env_extra=None, address_space=None):
    """``address_space``: a RLIMIT_AS (bytes) for the CLI and its workers, a memory cap that raises MemoryError."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.update(env_extra or {})

    def cap():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    r = subprocess.run([sys.executable, "-m", "data_prep", *map(str, args)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout, preexec_fn=cap if address_space else None)
    if check and r.returncode != 0:
        raise AssertionError(f"data_prep {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}\n{r.stdout}")
    return r


def write_jsonl(path, records):
    with open(path, "wb") as f:
        for r in records:
            f.write(orjson.dumps(r) + b"\n")
    return path


def read_all_docs(out_dir):
    """Every sequence of every shard in manifest order, as lists of ints, via megatron-core's reader."""
    import json

    from data_prep.write.shards import indexed_dataset_class

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


# A step list with both dedup kinds, and few buckets so that slices of 2 each own some (as YAML: JSON is YAML).
DEDUP_STEP_LIST = {"steps": [{"exact_dedup": {}}, {"minhash_dedup": {"threshold": 0.8}}], "buckets": 4}


def write_duplicated_corpus(d, files=4, per_file=5, seed=11):
    """``files`` jsonl files (one work unit each at --shard-size 20000) of unrelated 200-word documents, where each
    file after the first also holds an exact copy and a one-word edit (Jaccard ~0.95) of documents of the file
    before it: duplicates across units, for the curation passes to find. Returns (input dir, steps.yaml path)."""
    import json

    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, int(rng.integers(3, 9)))) for _ in range(400)]
    os.makedirs(d, exist_ok=True)
    prev = []
    for f in range(files):
        docs = [" ".join(rng.choice(vocab, 200)) for _ in range(per_file)]
        if prev:
            words = prev[1].split()
            words[100] = f"edited{f}"
            docs += [prev[0], " ".join(words)]
        write_jsonl(os.path.join(d, f"part{f}.jsonl"), [{"text": t} for t in docs])
        prev = docs
    steps = os.path.join(d, "..", os.path.basename(d) + "_steps.yaml")
    with open(steps, "w") as fh:
        json.dump(DEDUP_STEP_LIST, fh)
    return str(d), os.path.abspath(steps)


def train_byte_level_bpe(texts, out_dir, pre_tokenizer, vocab_size: int, special: str) -> str:
    """A byte-level BPE trained with the tokenizers library on ``texts[:60]``, saved as ``out_dir/tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[special],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts[:60], trainer)
    path = os.path.join(str(out_dir), "tokenizer.json")
    tok.save(path)
    return path


def cli_here(capsys, *args):
    """`python -m data_prep ARGS` in this process (data_prep.cli.main, argparse's exit included): a
    CompletedProcess-like (returncode, stdout, stderr) for refusals and small runs, without a subprocess's second
    of start-up (the unit tier's budget)."""
    from data_prep.cli import main

    capsys.readouterr()
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:  # argparse's refusals
        rc = e.code if isinstance(e.code, int) else 2
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["data_prep", *map(str, args)], rc, out.out, out.err)

"""Shared fixtures of the checkpoint-interop tests: a real-text corpus with its own sentencepiece tokenizer, and
tiny training runs (real DeepSpeed engines, gloo processes) whose checkpoints the tests export, import and reshape.

Runs are shared across test files (session scope) so that each layout trains once:
  llama_222   Llama-family recipe, TP=2 x PP=2 x DP=2, ZeRO-1, 6 steps, checkpoints at steps 3 and 6
  llama_222_tied  the same with tied embeddings (a copy on the first and the last pipeline stage)
  llama_111   the same recipe at 1 x 1 x 1, 6 steps
  gpt_22      GPT-family recipe (learned positions, LayerNorm, GeLU, biases, tied embeddings), TP=2 x PP=2, 4 steps
  gpt_11      the same at 1 x 1, ZeRO-0 (weights from the model-states file), 4 steps
  llama_z3    the Llama recipe at TP=2 x DP=1, ZeRO-3 (weights only in the optimizer partitions), 6 steps
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

from interop_runs import EOD, RECIPE, Run, VOCAB, run_overrides  # noqa: F401 (fixtures below use them)
from tests.support.corpus import stdlib_texts
from tests.support.runs import pretrain


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict:
    """sentencepiece model (data_prep's trainer) + Megatron shards + manifest.json over Python stdlib sources."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    import sentencepiece as spm

    from data_prep.steps.train_tokenizer import train

    out = tmp_path_factory.mktemp("interop_corpus")
    texts = stdlib_texts(400_000)
    src = out / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    model = train([str(src)], str(out / "sp"), vocab_size=VOCAB, threads=1, quiet=True)
    sp = spm.SentencePieceProcessor(model_file=model)
    builder = IndexedDatasetBuilder(str(out / "shard_000.bin"), dtype=np.uint16)
    tokens = 0
    for ids in sp.encode(texts):
        ids = np.asarray(ids + [EOD], dtype=np.int64)
        builder.add_document(ids, [len(ids)])
        tokens += len(ids)
    builder.finalize(str(out / "shard_000.idx"))
    manifest = {"tokenizer": {"vocab_size": VOCAB, "eod_id": EOD, "pad_id": 3, "type": "sentencepiece",
                              "path": model},
                "dtype": "uint16", "shards": [{"prefix": "shard_000", "tokens": tokens}],
                "blend": [tokens, "shard_000"]}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return {"manifest": str(out / "manifest.json"), "sp_model": model, "texts": texts}


@pytest.fixture(scope="session")
def gpt_recipe(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("recipes") / "tiny-gpt-cpu.yaml"
    path.write_text(f"""name: tiny-gpt-cpu
extends: [{RECIPE}]
model:
  position_embedding: learned
  normalization: layernorm
  activation: gelu
  tied_embeddings: true
  add_bias_linear: true
  ffn_hidden_size: 256
""")
    return str(path)


def _train(tmp_path_factory, corpus, name, n, config, extra) -> Run:
    run_dir = tmp_path_factory.mktemp(name)
    overrides = run_overrides(corpus, run_dir) + extra
    pretrain(n, *overrides, config=config, timeout=400)
    return Run(run_dir, config, overrides)


@pytest.fixture(scope="session")
def llama_222(tmp_path_factory, corpus) -> Run:
    return _train(tmp_path_factory, corpus, "llama_222", 8, RECIPE,
                  ["parallel.tp=2", "parallel.pp=2", "parallel.zero_stage=1", "training.train_steps=6",
                   "checkpoint.save_interval=3", "checkpoint.keep_last=2"])


@pytest.fixture(scope="session")
def llama_222_tied(tmp_path_factory, corpus) -> Run:
    return _train(tmp_path_factory, corpus, "llama_222_tied", 8, RECIPE,
                  ["model.tied_embeddings=true", "parallel.tp=2", "parallel.pp=2", "parallel.zero_stage=1",
                   "training.train_steps=6", "checkpoint.save_interval=3", "checkpoint.keep_last=2"])


@pytest.fixture(scope="session")
def llama_111(tmp_path_factory, corpus) -> Run:
    return _train(tmp_path_factory, corpus, "llama_111", 1, RECIPE, ["training.train_steps=6"])


@pytest.fixture(scope="session")
def gpt_22(tmp_path_factory, corpus, gpt_recipe) -> Run:
    return _train(tmp_path_factory, corpus, "gpt_22", 4, gpt_recipe,
                  ["parallel.tp=2", "parallel.pp=2", "training.train_steps=4"])


@pytest.fixture(scope="session")
def gpt_11(tmp_path_factory, corpus, gpt_recipe) -> Run:
    return _train(tmp_path_factory, corpus, "gpt_11", 1, gpt_recipe,
                  ["training.train_steps=4", "parallel.zero_stage=0"])


@pytest.fixture(scope="session")
def llama_z3(tmp_path_factory, corpus) -> Run:
    return _train(tmp_path_factory, corpus, "llama_z3", 2, RECIPE,
                  ["parallel.tp=2", "parallel.zero_stage=3", "training.train_steps=6"])

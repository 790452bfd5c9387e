"""`python -m recipes evaluate` on a real tiny checkpoint: lm-evaluation-harness (HF backend) runs the shipped local
tasks offline and produces scores, logged to metrics.jsonl and TensorBoard; its perplexity equals one computed
directly with transformers on the same export and text (each token scored once, in windows of the model's context
length, every document starting after EOD as in training)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from interop_runs import REPO
from recipes.hf.export import export
from recipes.tools.evaluate import TASKS_DIR

pytestmark = pytest.mark.multiproc


def reference_log_likelihood(model, ids: list[int], prefix: int, window: int) -> float:
    """Sum of log p(token | previous tokens) over `ids`, written out here: windows of `window` new tokens, each
    scored from the `window` tokens that end just before its last token ([prefix] + ids: the first sees the prefix)."""
    seq = [prefix] + ids
    total = 0.0
    for start in range(0, len(ids), window):
        end = min(start + window, len(ids))  # predicts ids[start:end] = seq[start + 1:end + 1]
        inputs = seq[max(0, end - window):end]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([inputs])).logits[0].double(), dim=-1)
        n = end - start
        targets = torch.tensor(seq[end + 1 - n:end + 1])
        total += float(logp[-n:].gather(1, targets[:, None]).sum())
    return total


def test_evaluate_checkpoint_scores_and_perplexity_matches_transformers(llama_111, tmp_path):
    logs = tmp_path / "logs"
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", OMP_NUM_THREADS="1")  # any download attempt fails
    res = subprocess.run([sys.executable, "-m", "recipes", "evaluate", "--checkpoint", str(llama_111.path),
                          *llama_111.overrides, "--out", str(tmp_path / "res.json"), "--quiet",
                          "--log-metrics", str(logs / "metrics.jsonl"), "--step", "6",
                          "--tensorboard", str(logs / "tensorboard")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    result = json.loads((tmp_path / "res.json").read_text())
    scores = result["scores"]
    assert 0.0 <= scores["recipes_mc/acc"] <= 1.0 and result["n_samples"]["recipes_mc"] == 20
    assert {"recipes_ppl/word_perplexity", "recipes_ppl/byte_perplexity", "recipes_ppl/bits_per_byte"} <= set(scores)
    record = json.loads((logs / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 6 and record["eval/recipes_mc/acc"] == scores["recipes_mc/acc"]
    assert list((logs / "tensorboard").glob("events.out.tfevents.*"))

    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir = export(str(llama_111.path), str(tmp_path / "hf"), llama_111.recipe())
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    texts = [json.loads(x)["text"] for x in (TASKS_DIR / "recipes_ppl.jsonl").read_text().splitlines()]
    window = model.config.max_position_embeddings
    ll, n_bytes, windows = 0.0, 0, 0
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        windows += -(-len(ids) // window)
        ll += reference_log_likelihood(model, ids, tok.eos_token_id, window)
        n_bytes += len(text.encode("utf-8"))
    assert windows > len(texts), "the texts should need several windows each for this check to cover the rolling"
    assert scores["recipes_ppl/byte_perplexity"] == pytest.approx(math.exp(-ll / n_bytes), rel=1e-4)
    assert scores["recipes_ppl/bits_per_byte"] == pytest.approx(-ll / n_bytes / math.log(2), rel=1e-4)

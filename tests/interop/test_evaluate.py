"""`python -m recipes evaluate` on real tiny checkpoints, run by the training loop every N steps: lm-evaluation-harness
(HF backend) runs the shipped local tasks offline and produces scores, logged to metrics.jsonl and TensorBoard and
shown by the report; its perplexity equals one computed directly with transformers on the same export and text (each
token scored once, in windows of the model's context length, every document starting after EOD as in training), and
its multiple-choice accuracy one computed from the same export's log-probabilities."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from interop_runs import RECIPE, run_overrides
from recipes.config.loading import load_recipe
from recipes.hf.export import export
from recipes.tools.evaluate import TASKS_DIR
from recipes.tools.report import read_evals, write_report
from tests.support.runs import pretrain, recipes_cli

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


def reference_choice_scores(model, tok, docs: list[dict]) -> tuple[float, float]:
    """lm-eval's multiple_choice acc and acc_norm, written out here: per choice, the summed log p of the continuation's
    tokens after the question's. As lm-eval does, the question's trailing spaces move into the continuation, the
    continuation's tokens are those of tokenize(question + choice) past len(tokenize(question)) (none when the choice
    merges into the question's last token: a sum of 0), and the model reads question tokens + continuation tokens. The
    prediction is the best sum, or for acc_norm the best sum per character of the choice."""
    right = right_norm = 0
    for doc in docs:
        scores = []
        for choice in doc["choices"]:
            question = doc["question"].rstrip()
            context = tok(question)["input_ids"]
            continuation = tok(question + doc["question"][len(question):] + choice)["input_ids"][len(context):]
            seq, n = context + continuation, len(continuation)
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([seq[:-1]])).logits[0].double(), dim=-1)
            scores.append(float(logp[len(seq) - 1 - n:].gather(1, torch.tensor(continuation)[:, None]).sum()) if n
                          else 0.0)
        right += max(range(len(scores)), key=scores.__getitem__) == doc["answer"]
        per_char = [x / len(c) for x, c in zip(scores, doc["choices"])]
        right_norm += max(range(len(per_char)), key=per_char.__getitem__) == doc["answer"]
    return right / len(docs), right_norm / len(docs)


def test_evaluation_during_training_scores_match_transformers(corpus, tmp_path):
    """A 1-rank run with evaluation.interval=3 evaluates its step-3 and step-6 checkpoints in background
    subprocesses (`recipes evaluate --checkpoint`, offline); scores land in metrics.jsonl, TensorBoard and the report."""
    overrides = run_overrides(corpus, tmp_path) + ["training.train_steps=6", "evaluation.interval=3"]
    env_guard = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # any download attempt by the evaluation fails
    os.environ.update(env_guard)
    try:
        pretrain(1, *overrides, timeout=600)
    finally:
        for k in env_guard:
            os.environ.pop(k)
    evals = read_evals(tmp_path / "logs" / "metrics.jsonl")
    assert [r["step"] for r in evals] == [3, 6], (tmp_path / "logs" / "evaluate_step3.log").read_text()[-3000:]
    scores = {k[len("eval/"):]: v for k, v in evals[-1].items() if k.startswith("eval/")}
    assert {"recipes_ppl/word_perplexity", "recipes_ppl/byte_perplexity", "recipes_ppl/bits_per_byte"} <= set(scores)
    assert list((tmp_path / "logs" / "tensorboard").glob("events.out.tfevents.*.eval"))
    report = write_report(tmp_path / "report", metrics=tmp_path / "logs" / "metrics.jsonl").read_text()
    assert "## Downstream evaluation" in report and (tmp_path / "report" / "evals.png").is_file()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = load_recipe(RECIPE, overrides)
    hf_dir = export(str(tmp_path), str(tmp_path / "hf"), recipe, tag="global_step6")
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
    # the multiple choice accuracy, computed again from the same export's log-probabilities
    docs = [json.loads(x) for x in (TASKS_DIR / "recipes_mc.jsonl").read_text().splitlines()]
    acc, acc_norm = reference_choice_scores(model, tok, docs)
    assert (scores["recipes_mc/acc"], scores["recipes_mc/acc_norm"]) == pytest.approx((acc, acc_norm)), (acc, acc_norm)


def test_evaluate_refuses_a_directory_without_a_model(tmp_path):
    res = recipes_cli(["evaluate", "--model", str(tmp_path)], env=dict(os.environ), timeout=120)
    assert res.returncode == 2 and "config.json missing" in res.stderr and "--checkpoint" in res.stderr

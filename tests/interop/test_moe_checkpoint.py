"""MoE families through real expert-parallel checkpoints (EP=2 x TP=2: each rank holds half the experts, each expert
split over two TP ranks):

- a transformers Mixtral / Qwen2-MoE model (random init from a tiny config) -> `import-hf` at EP2 x TP2 (the writer
  cuts every expert's shard) -> `export-hf` (the engine-based reader gathers them back) -> transformers loads the
  same class and computes the original logits;
- training a MoE model for 2 steps at EP2 x TP2 and at 1 x 1 (the same steps: test_moe_training.py) -> export both ->
  the exported logits agree; and the reader of the 1 x 1 checkpoint returns exactly what the offline reader
  (recipes.checkpoint.format.read) returns, so the engine-based reader is checked against an independent one.
"""
from __future__ import annotations

import pytest
import torch

from interop_runs import RECIPE, VOCAB
from recipes.checkpoint.format.read import read_full_state
from recipes.checkpoint.recipe_file import load_checkpoint_recipe
from tests.support.engine_read import read_by_engines
from tests.support.runs import pretrain, recipes_cli

pytestmark = pytest.mark.multiproc

TOL = 1e-4
EP2_TP2 = ["parallel.tp=2", "parallel.ep=2", "parallel.pp=1", "parallel.dp=2"]
ARCH = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


def _cli(*argv: str) -> None:
    """A recipes command as users run it, forked from the tests' template: its engine ranks are forked too."""
    r = recipes_cli(list(argv), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]


def _tokens(seed=0):
    return torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(seed))


def _load_hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.mark.parametrize("kind", list(ARCH))
def test_import_at_ep2_tp2_then_export_gives_the_transformers_logits(kind, corpus, tmp_path):
    from test_moe_families import hf_moe_model

    hf = hf_moe_model(kind, tmp_path / "hf", seed=2, vocab_size=VOCAB, max_position_embeddings=256)
    ckpt, out = tmp_path / "ckpt", tmp_path / "export"
    _cli("import-hf", "--hf", str(tmp_path / "hf"), "--out", str(ckpt), "--config", RECIPE, "--quiet",
         f"data.manifests=[{corpus['manifest']}]", *EP2_TP2)
    recipe = load_checkpoint_recipe(str(ckpt), None, [])
    experts = 4 if kind == "mixtral" else 6
    assert (recipe.parallel.tp, recipe.parallel.ep, recipe.model.moe.num_experts) == (2, 2, experts)
    _cli("export-hf", "--checkpoint", str(ckpt), "--out", str(out), "--quiet")
    back = _load_hf(out)
    assert type(back).__name__ == ARCH[kind]
    x = _tokens()
    with torch.no_grad():
        diff = (back(x).logits - hf(x).logits).abs().max().item()
    print(f"{kind} via EP2 x TP2 checkpoint: max |logits diff| = {diff:.2e}")
    assert diff <= TOL


MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.aux_loss_coeff=0.01", "training.train_steps=2",
       f"model.vocab_size={VOCAB}", "training.eval_interval=1000"]


def test_trained_ep2_tp2_checkpoint_exports_the_same_model_as_single_process(corpus, tmp_path):
    single, ep_tp = tmp_path / "single", tmp_path / "ep2tp2"
    pretrain(1, f"data.manifests=[{corpus['manifest']}]", f"checkpoint.dir={single}", *MOE)
    pretrain(4, f"data.manifests=[{corpus['manifest']}]", f"checkpoint.dir={ep_tp}", *MOE, "parallel.tp=2",
             "parallel.ep=2", timeout=600)
    recipe = load_checkpoint_recipe(str(single), None, [])
    via_engines = read_by_engines(single, (single / "latest").read_text().strip(), tmp_path / "engines")["weights"]
    offline = read_full_state(single, recipe.model).weights  # ep = tp = 1: the offline reader knows every name
    assert list(via_engines) == list(offline)
    assert all(torch.equal(via_engines[k], offline[k]) for k in offline)
    for run in (single, ep_tp):
        _cli("export-hf", "--checkpoint", str(run), "--out", str(tmp_path / f"hf_{run.name}"), "--quiet")
    a, b = _load_hf(tmp_path / "hf_single"), _load_hf(tmp_path / "hf_ep2tp2")
    assert type(a).__name__ == type(b).__name__ == "MixtralForCausalLM"
    x = _tokens(1)
    with torch.no_grad():
        la, lb = a(x).logits, b(x).logits
    diff = (la - lb).abs().max().item()
    print(f"trained 1x1 vs EP2 x TP2 exports: max |logits diff| = {diff:.2e}")
    assert diff <= TOL

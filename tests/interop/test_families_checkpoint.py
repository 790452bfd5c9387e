"""Checkpoint families through real checkpoints: a transformers Llama 3.x / Qwen2 model (random init from a config)
-> `import-hf` at TP=2 (the q/k/v bias and llama3 RoPE through the sharded writer and recipe.yaml) -> our model's
logits == transformers'; -> `export-hf` (no --config: the stored recipe.yaml) -> transformers loads the right class
and computes the same logits; and continued pretraining from the imported Qwen2 checkpoint (2 steps at TP=2, the
documented commands) exports to a Qwen2 model that matches the trained weights.

The in-process conversions, the Mistral refusal and the parameter counts are in test_families.py.
"""
from __future__ import annotations

import pytest
import torch

from interop_runs import RECIPE, VOCAB
from tests.support.plain_model import build_plain_model, logits
from recipes.checkpoint.format.read import read_full_state
from recipes.checkpoint.recipe_file import load_checkpoint_recipe
from recipes.hf.export import main as export_main
from tests.support.runs import pretrain, recipes_cli, train_records

pytestmark = pytest.mark.multiproc

TOL = 1e-4
ARCH = {"llama3": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _hf(kind: str, out, sp_model: str):
    from transformers import AutoModelForCausalLM

    from test_families import hf_config, perturb

    torch.manual_seed(1)
    cfg = hf_config(kind, vocab_size=VOCAB, tie_word_embeddings=kind == "qwen2")  # the corpus' tokenizer
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    perturb(model.named_parameters(), seed=1)
    model.save_pretrained(str(out))
    if kind == "llama3":  # a tokenizer.json-only tokenizer (as Llama 3 ships), made from the corpus' sentencepiece
        from pathlib import Path

        from recipes.hf.export import write_tokenizer

        write_tokenizer(Path(sp_model), out)
        (out / "tokenizer.model").unlink()
    return model


@pytest.fixture(scope="module")
def imported(tmp_path_factory, corpus):
    """kind -> (transformers model, imported checkpoint dir), each imported at TP=2 x PP=1 x DP=1 via the CLI."""
    out = {}
    for kind in ARCH:
        root = tmp_path_factory.mktemp(f"family_{kind}")
        hf = _hf(kind, root / "hf", corpus["sp_model"])
        ckpt = root / "ckpt"
        # as users run it, forked from the tests' template (its ranks too): in this process, which has built HF
        # tokenizers (their thread pool), the ranks would be fresh interpreters under torchrun (~30 s of CPU more)
        r = recipes_cli(["import-hf", "--hf", str(root / "hf"), "--out", str(ckpt), "--config", RECIPE, "--quiet",
                         f"data.manifests=[{corpus['manifest']}]", "parallel.tp=2", "parallel.pp=1", "parallel.dp=1"])
        assert r.returncode == 0, r.stderr[-4000:]
        out[kind] = (hf, ckpt)
    return out


def _tokens(seed=0):
    return torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(seed))


def _ours(ckpt, tag=None):
    recipe = load_checkpoint_recipe(str(ckpt), None, [])
    return recipe, build_plain_model(recipe, read_full_state(ckpt, recipe.model, tag=tag).weights)


@pytest.mark.parametrize("kind", list(ARCH))
def test_imported_tp2_checkpoint_computes_the_transformers_logits(imported, kind):
    hf, ckpt = imported[kind]
    recipe, ours = _ours(ckpt)
    assert recipe.parallel.tp == 2
    assert recipe.model.add_qkv_bias == (kind == "qwen2")
    assert (recipe.data.tokenizer == str((ckpt.parent / "hf").resolve())) == (kind == "llama3")
    assert (recipe.model.rope_scaling is not None) == (kind == "llama3")  # survived recipe.yaml
    x = _tokens()
    with torch.no_grad():
        diff = (logits(ours, x, VOCAB) - hf(x).logits).abs().max().item()
    print(f"import-hf {kind} TP=2: max |logits diff| = {diff:.2e}")
    assert diff <= TOL


@pytest.mark.parametrize("kind", list(ARCH))
def test_export_loads_as_the_family_class_with_the_same_logits(imported, kind, tmp_path):
    from transformers import AutoModelForCausalLM

    hf, ckpt = imported[kind]
    assert export_main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "hf"), "--quiet"]) == 0
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()
    assert type(back).__name__ == ARCH[kind]
    assert back.config.tie_word_embeddings == hf.config.tie_word_embeddings
    assert back.config.rope_parameters["rope_theta"] == hf.config.rope_parameters["rope_theta"]
    x = _tokens(1)
    with torch.no_grad():
        diff = (back(x).logits - hf(x).logits).abs().max().item()
    print(f"export-hf {kind} from TP=2: max |logits diff| = {diff:.2e}")
    assert diff <= TOL
    if kind == "llama3":  # the imported tokenizer.json travels through data.tokenizer to the export
        from transformers import AutoTokenizer

        src = AutoTokenizer.from_pretrained(str(ckpt.parent / "hf"), local_files_only=True)
        out = AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
        for text in ("def f(x):\n    return x + 1", " lead", "ünïcode"):
            assert out.encode(text) == src.encode(text)
        assert back.config.eos_token_id == src.eos_token_id is not None


def test_continued_pretraining_from_imported_qwen2(imported, tmp_path):
    """The documented commands: train from the imported checkpoint with its recipe.yaml, then export the result."""
    from transformers import AutoModelForCausalLM

    hf, ckpt = imported["qwen2"]
    pretrain(2, "training.train_steps=2", f"checkpoint.dir={ckpt}", config=str(ckpt / "recipe.yaml"), timeout=400)
    records = train_records(ckpt)
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] < 7.0 for r in records)  # ln(512) = 6.24
    assert export_main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "hf"), "--quiet"]) == 0
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()
    assert type(back).__name__ == "Qwen2ForCausalLM"
    recipe, ours = _ours(ckpt, tag="global_step2")
    x = _tokens(2)
    with torch.no_grad():
        theirs, before = back(x).logits, hf(x).logits
        diff = (logits(ours, x, VOCAB) - theirs).abs().max().item()
    print(f"export-hf qwen2 after 2 steps at TP=2: max |logits diff| = {diff:.2e}")
    assert diff <= TOL
    assert (theirs - before).abs().max().item() > 1e-3  # the weights did train

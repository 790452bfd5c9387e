"""Import: a transformers Llama directory becomes a training checkpoint at a chosen layout; import(export(ckpt))
gives back the checkpoint's weights bit for bit (the conversions only slice, concatenate and transpose)."""
from __future__ import annotations

import torch

import pytest

from interop_runs import RECIPE
from recipes.checkpoint.format.read import read_full_state
from recipes.hf.export import export, main as export_main
from recipes.hf.importer import hf_recipe
from tests.support.runs import recipes_cli

pytestmark = pytest.mark.multiproc


def test_import_of_export_gives_identical_weights(llama_222, corpus, tmp_path):
    from safetensors.torch import load_file

    original = read_full_state(llama_222.path, llama_222.recipe().model).weights
    hf_dir = tmp_path / "hf"
    export(str(llama_222.path), str(hf_dir), llama_222.recipe())
    recipe, _ = hf_recipe(str(hf_dir), RECIPE, [f"data.manifests=[{corpus['manifest']}]", "parallel.tp=2",
                                                "parallel.pp=1", "parallel.dp=1"])
    assert recipe.model == llama_222.recipe().model  # architecture recovered from config.json
    ckpt = tmp_path / "imported"
    r = recipes_cli(["import-hf", "--hf", str(hf_dir), "--out", str(ckpt), "--config", RECIPE, "--quiet",
                     f"data.manifests=[{corpus['manifest']}]", "parallel.tp=2", "parallel.pp=1", "parallel.dp=1"])
    assert r.returncode == 0, r.stderr[-4000:]  # as users run it: forked from the tests' template, its ranks too
    assert (ckpt / "latest").read_text().strip() == "global_step0"
    back = read_full_state(ckpt, recipe.model, with_moments=True)
    assert list(back.weights) == list(original)
    for name, tensor in original.items():
        assert torch.equal(back.weights[name], tensor), name
    assert all(v.abs().sum() == 0 for v in back.exp_avg.values())  # a fresh optimizer for continued pretraining

    # the imported checkpoint carries its recipe: export it again without --config, same tensors as the first export
    again = tmp_path / "hf_again"
    assert export_main(["--checkpoint", str(ckpt), "--out", str(again), "--quiet"]) == 0
    first, second = load_file(str(hf_dir / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)

"""DeepSeek-V3 between transformers and our checkpoints, against transformers' own DeepseekV3ForCausalLM (random init
from a tiny config, non-zero score-correction bias: tests/interop/deepseek_models.py):

- one process: our model holding the transformers weights computes its logits;
- a directory with MTP depths in DeepSeek's released layout -> `import-hf` at TP2 x DP2 x EP2 and at TP2 x PP2 x EP2
  (the writer cuts MLA heads, experts and the shared expert; the last stage holds the depth and its embedding copy)
  -> `export-hf` -> transformers loads the same class and computes the original logits (within 1e-4), the depth comes
  back with the same tensors, and transformers' own MTP module (MtpModel, the drafting head of generate(use_mtp=True))
  loads it and predicts what our depth predicts; the TP2 x PP2 x EP2 checkpoint reshaped to EP1 exports the same;
- a run started from the imported checkpoint (`checkpoint.init_from`) at another layout begins where a run resuming
  the imported checkpoint itself begins: same first loss, same routing biases.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from deepseek_models import add_released_style_depths, hf_deepseek
from interop_runs import RECIPE, REPO, VOCAB
from recipes.checkpoint.recipe_file import load_checkpoint_recipe
from tests.support.runs import pretrain, recipes_cli, train_records

TOL = 1e-4
DEEPSEEK_RECIPE = str(REPO / "configs/runs/tiny-deepseek-cpu.yaml")


def _tokens(seed=0):
    return torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(seed))


def _recipe_of(hf_cfg, depths: int = 0):
    from recipes.config.loading import load_recipe
    from recipes.hf.convert import _rope_fields
    from recipes.hf.deepseek import model_fields

    fields = model_fields(hf_cfg, _rope_fields, depths)
    overrides = []
    for k, v in fields.items():
        items = v.items() if isinstance(v, dict) else [(None, v)]
        overrides += [f"model.{k}{'' if kk is None else '.' + kk}={'' if vv is None else vv}" for kk, vv in items]
    return load_recipe(RECIPE, overrides)


@pytest.mark.unit
def test_our_model_with_transformers_weights_gives_its_logits():
    from tests.support.plain_model import build_plain_model, logits
    from recipes.hf.deepseek import from_deepseek

    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.707}  # cos/sin scaled too
    got = {}
    for name, variant in {"mla": {}, "no q compression": {"q_lora_rank": None},
                          "yarn": {"rope_parameters": yarn, "max_position_embeddings": 64}}.items():
        hf = hf_deepseek(VOCAB, seed=1, **variant)
        recipe = _recipe_of(hf.config)
        ours = build_plain_model(recipe, from_deepseek(hf.state_dict(), recipe.model))
        x = _tokens()
        with torch.no_grad():
            got[name] = logits(ours, x, VOCAB)
            diff = (got[name] - hf(x).logits).abs().max().item()
        assert diff <= TOL, (name, diff)
    assert recipe.model.rope_scaling.type == "yarn" and recipe.model.rope_scaling.factor == 4.0
    assert (got["yarn"] - got["mla"]).abs().max() > 10 * TOL  # yarn's frequencies and scales do show


def _cli(*argv: str) -> None:
    r = recipes_cli(list(argv), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A transformers DeepSeek-V3 directory with one MTP depth in DeepSeek's layout, its model, the depth's tensors."""
    hf_dir = tmp_path_factory.mktemp("deepseek_hf")
    hf = hf_deepseek(VOCAB, seed=2)
    hf.save_pretrained(str(hf_dir))
    depth = add_released_style_depths(hf_dir, _recipe_of(hf.config, depths=1), hf.state_dict())
    return hf_dir, hf, depth


def _mtp_model(main, export_dir):
    """transformers' MTP drafting module loaded from `export_dir` (its checkpoint regex knows only DeepSeek-V3's
    layer 61; a 3-layer model's depth is layer 3, so the pattern is widened to it)."""
    import re

    from transformers.modeling_layers import MtpModel

    L = main.config.num_hidden_layers
    original = MtpModel.get_mtp_weights_regex
    MtpModel.get_mtp_weights_regex = staticmethod(lambda m: re.compile(rf"model\.layers\.{L}\."))
    try:
        main.config.name_or_path = str(export_dir)
        return MtpModel.from_pretrained(main).eval()
    finally:
        MtpModel.get_mtp_weights_regex = original


LAYOUTS = {"tp2-dp2-ep2": ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2", "parallel.pp=1"],
           "tp2-pp2-ep2": ["parallel.tp=2", "parallel.dp=2", "parallel.ep=2", "parallel.pp=2"]}


@pytest.mark.multiproc
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_import_then_export_gives_transformers_logits_and_the_mtp_depth(name, released, corpus, tmp_path):
    from transformers import AutoModelForCausalLM

    hf_dir, hf, depth = released
    ckpt, out = tmp_path / "ckpt", tmp_path / "export"
    _cli("import-hf", "--hf", str(hf_dir), "--out", str(ckpt), "--config", RECIPE, "--quiet",
         f"data.manifests=[{corpus['manifest']}]", *LAYOUTS[name])
    recipe = load_checkpoint_recipe(str(ckpt), None, [])
    assert (recipe.model.mtp.num_layers, recipe.model.moe.num_groups, recipe.parallel.ep) == (1, 4, 2)
    _cli("export-hf", "--checkpoint", str(ckpt), "--out", str(out), "--quiet")
    back = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(back).__name__ == "DeepseekV3ForCausalLM" and back.config.num_mtp_layers == 1
    x = _tokens()
    with torch.no_grad():
        diff = (back(x).logits - hf(x).logits).abs().max().item()
    print(f"DeepSeek-V3 via {name} checkpoint: max |logits diff| = {diff:.2e}")
    assert diff <= TOL
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    from safetensors import safe_open

    with safe_open(str(out / index["model.layers.3.eh_proj.weight"]), "pt") as f:
        for k, t in depth.items():
            assert torch.allclose(f.get_tensor(k), t, atol=1e-7), k
    _assert_depth_predicts_as_transformers_mtp(back, out, recipe)
    if recipe.parallel.pp > 1:  # reshaped across EP and PP (moments and routing biases carried), exported again
        _cli("reshape", "--checkpoint", str(ckpt), "--out", str(tmp_path / "ep1"), "--to", "tp=1,pp=1,dp=2,ep=1",
             "--quiet")
        _cli("export-hf", "--checkpoint", str(tmp_path / "ep1"), "--out", str(tmp_path / "export-ep1"), "--quiet")
        again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export-ep1"), dtype=torch.float32).eval()
        with torch.no_grad():
            assert (again(x).logits - hf(x).logits).abs().max().item() <= TOL


def _assert_depth_predicts_as_transformers_mtp(back, out, recipe):
    """Depth 1's logits at every position: ours (the exported weights in our model) vs transformers' MtpModel."""
    from tests.support.plain_model import build_plain_model
    from recipes.hf.deepseek import depth_tensors, from_deepseek

    state = {**back.state_dict(), **depth_tensors(str(out), recipe.model.num_layers, 1)}
    ours = build_plain_model(recipe, from_deepseek(state, recipe.model))
    x = _tokens(1)
    labels = torch.cat([x[:, 1:], x[:, :1]], dim=1)  # the next tokens (the last one wraps: not compared)
    with torch.no_grad():
        both = ours.logits(x, mtp_labels=labels).transpose(0, 1)[..., :VOCAB]
        hidden = back.model(x, output_hidden_states=True).hidden_states[-1]  # what generate(use_mtp=True) hands it
        mtp = _mtp_model(back, out)
        h = mtp.forward_layer(0, hidden[:, :-1], position_ids=torch.arange(63).expand(2, 63), mtp_cache=None,
                              input_ids=x[:, 1:])
        theirs = mtp._project_to_logits(h)
    ours_depth = both[:, 64:64 + 63]
    diff = (ours_depth - theirs).abs().max().item()
    print(f"MTP depth 1 vs transformers' MtpModel: max |logits diff| = {diff:.2e}")
    assert diff <= TOL


@pytest.mark.multiproc
def test_init_from_an_imported_checkpoint_starts_from_its_weights_and_biases(released, corpus, tmp_path):
    hf_dir, _, _ = released
    ckpt = tmp_path / "imported"
    _cli("import-hf", "--hf", str(hf_dir), "--out", str(ckpt), "--config", DEEPSEEK_RECIPE, "--quiet",
         f"data.manifests=[{corpus['manifest']}]", f"model.vocab_size={VOCAB}")
    common = [f"data.manifests=[{corpus['manifest']}]", "training.train_steps=1", "training.eval_interval=1000"]
    own = tmp_path / "own"  # a copy of the import, resumed as it is (1 process)
    shutil.copytree(ckpt, own)
    pretrain(1, *common, f"checkpoint.dir={own}", config=str(own / "recipe.yaml"))
    started = tmp_path / "started"  # a new run from it at EP2 x DP2
    pretrain(4, *common, f"checkpoint.dir={started}", f"checkpoint.init_from={ckpt}", "parallel.ep=2",
             "parallel.dp=", config=str(ckpt / "recipe.yaml"), timeout=600)
    a, b = train_records(own)[-1], train_records(started)[0]
    assert abs(a["loss"] - b["loss"]) <= 1e-5 * a["loss"], (a["loss"], b["loss"])
    assert a["moe_expert_bias"] == b["moe_expert_bias"]
    assert any(abs(v) > 0.01 for layer in a["moe_expert_bias"] for v in layer)  # the imported (non-zero) biases

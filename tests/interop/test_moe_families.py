"""MoE checkpoint families in one process: Mixtral, Qwen2-MoE (gated shared expert, q/k/v bias, a dense layer) and
Qwen3-MoE (qk norm, head_dim, a dense layer) against transformers' own classes built from tiny configs (nothing
downloaded), both directions, as tests/interop/test_families.py does for the dense families:
  import  transformers model (random init; norms, routers and gates perturbed so a wrong mapping shows) -> our
          PlainDecoder -> logits == transformers'
  export  our model's own initialisation -> to_hf -> the transformers class the export names -> logits == ours
fp32 on CPU, bound 1e-4 (a swapped gate/up, a transposed expert or a wrong router normalisation is O(0.1)).
"""
from __future__ import annotations

import pytest
import torch

from interop_runs import RECIPE
from tests.support.plain_model import build_plain_model, logits
from recipes.hf.convert import UnsupportedModel, family, from_llama, to_hf
from recipes.hf.importer import hf_recipe

pytestmark = pytest.mark.unit

TOL = 1e-4
SEQ = 32
SHAPE = dict(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=4 * SEQ, initializer_range=0.1, rope_parameters={"rope_type": "default",
                                                                                       "rope_theta": 1e6})
ARCH = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def moe_hf_config(kind: str, **kw):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    if kind == "mixtral":
        return MixtralConfig(**{**SHAPE, "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2,
                                **kw})
    qwen = dict(intermediate_size=80, moe_intermediate_size=32, num_experts=6, num_experts_per_tok=2,
                mlp_only_layers=[1])
    if kind == "qwen2_moe":
        return Qwen2MoeConfig(**{**SHAPE, **qwen, "shared_expert_intermediate_size": 56, "norm_topk_prob": False,
                                 **kw})
    if kind == "qwen3_moe":  # head_dim 32 with 4 heads and hidden 64: q is wider than the hidden state, as in Qwen3
        return Qwen3MoeConfig(**{**SHAPE, **qwen, "head_dim": 32, "norm_topk_prob": True, **kw})
    raise ValueError(kind)


def perturb(named_params, seed: int = 0) -> None:
    """Norms away from 1, biases from 0, routers and shared-expert gates random (transformers initialises the Qwen
    routers to zero: every expert tied, and the top-k of a tie is the library's choice, not the model's)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in named_params:
            if p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(("mlp.gate.weight", "router.weight", "shared_expert_gate.weight", "gate_weight")):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


def hf_moe_model(kind: str, out_dir, seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(moe_hf_config(kind, **kw), dtype=torch.float32).eval()
    perturb(model.named_parameters(), seed)
    model.save_pretrained(str(out_dir))
    return model


def tokens(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(seed))


def max_diff(ours, hf, x, vocab) -> float:
    with torch.no_grad():
        return (logits(ours, x, vocab) - hf(x).logits).abs().max().item()


@pytest.mark.parametrize("kind", list(ARCH))
def test_import_logits_match_transformers(kind, tmp_path):
    hf = hf_moe_model(kind, tmp_path / kind)
    recipe, _ = hf_recipe(str(tmp_path / kind), RECIPE, [f"model.seq_length={SEQ}"])
    m = recipe.model
    assert family(m) == kind
    assert m.moe.num_experts == (4 if kind == "mixtral" else 6) and m.moe.top_k == 2
    assert [m.is_moe_layer(i) for i in range(3)] == ([True] * 3 if kind == "mixtral" else [True, False, True])
    assert (m.moe.shared_expert_ffn_size, m.add_qkv_bias) == ((56, True) if kind == "qwen2_moe" else (None, False))
    assert (m.qk_norm, m.kv_channels) == ((True, 32) if kind == "qwen3_moe" else (False, 16))
    ours = build_plain_model(recipe, from_llama(hf.state_dict(), m))
    diff = max_diff(ours, hf, tokens(m.vocab_size), m.vocab_size)
    print(f"import {kind}: max |logits diff| = {diff:.2e}")
    assert diff <= TOL, f"{kind}: imported logits differ from transformers' by {diff:.2e}"


@pytest.mark.parametrize("kind", list(ARCH))
def test_export_logits_match_ours(kind, tmp_path):
    """Our own initialisation (experts seeded per expert, routers drawn by megatron-core) -> to_hf -> the class the
    exported config names."""
    from transformers import AutoModelForCausalLM

    hf_moe_model(kind, tmp_path / kind)
    recipe, _ = hf_recipe(str(tmp_path / kind), RECIPE, [f"model.seq_length={SEQ}", "training.seed=7"])
    from recipes.model.layers import PlainDecoder
    from recipes.parallel.layout import Layout

    mine = PlainDecoder(recipe, Layout(tp=1, pp=1, dp=1, zero_stage=0))
    perturb(mine.named_parameters(), seed=3)
    weights = {k: v for k, v in mine.state_dict().items() if not k.endswith("_extra_state")}
    weights = {k: (v[:recipe.model.vocab_size] if "word_embeddings" in k or "output_layer" in k else v)
               for k, v in weights.items()}
    config, state = to_hf(weights, recipe.model)
    assert config.architectures == [ARCH[kind]]
    theirs = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    theirs.load_state_dict(state, strict=True)
    ours = build_plain_model(recipe, weights)
    diff = max_diff(ours, theirs, tokens(recipe.model.vocab_size, seed=1), recipe.model.vocab_size)
    print(f"export {kind}: max |logits diff| = {diff:.2e}")
    assert diff <= TOL, f"{kind}: exported logits differ from ours by {diff:.2e}"


def test_router_normalisation_is_what_makes_the_logits_match(tmp_path):
    """Qwen2-MoE does not renormalise its top-k probabilities: importing it as if it did is far off, so the tests
    above would notice a routing bug."""
    hf = hf_moe_model("qwen2_moe", tmp_path / "q")
    recipe, _ = hf_recipe(str(tmp_path / "q"), RECIPE, [f"model.seq_length={SEQ}", "model.moe.normalize_top_k=true"])
    ours = build_plain_model(recipe, from_llama(hf.state_dict(), recipe.model))
    assert max_diff(ours, hf, tokens(recipe.model.vocab_size), recipe.model.vocab_size) > 100 * TOL


@pytest.mark.parametrize("overrides,expect", [
    (["model.moe.num_experts=4", "model.moe.layer_pattern=2"], ["Mixtral has experts in every layer"]),
    (["model.moe.num_experts=4", "model.moe.shared_expert_ffn_size=64"], ["Qwen2-MoE always gates it"]),
    (["model.moe.num_experts=4", "model.qk_norm=true", "model.add_qkv_bias=true"], ["attention_bias"]),
    (["model.qk_norm=true"], ["model.qk_norm=true without model.moe"]),
])
def test_models_without_a_transformers_class_are_refused(overrides, expect):
    from recipes.config.loading import load_recipe

    recipe = load_recipe(RECIPE, overrides)
    with pytest.raises(UnsupportedModel) as e:
        family(recipe.model)
    assert all(x in str(e.value) for x in expect), str(e.value)

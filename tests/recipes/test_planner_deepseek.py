"""The planner's DeepSeek-V3 terms against hand calculations written here (MLA's attention FLOPs, what it keeps for
backward, the keys and values CP gathers; what an MTP depth adds to the FLOPs and to the last stage's parameters),
the preset against the report's sizes, and its plan for DeepSeek's own cluster (2,048 H800) beside DeepSeek's
published layout (PP16 x EP64, ZeRO-1), which this trainer refuses and the planner prices."""
from __future__ import annotations

import pytest

from recipes.config.loading import deep_merge, load_raw, recipe_from_dict
from recipes.parallel.layout import Layout

pytestmark = pytest.mark.unit

S, V3_HEADS, V3_H = 4096, 128, 7168


def _v3(**cluster):
    raw = deep_merge(load_raw("models/deepseek-v3-like"), {"training": {"global_batch": 15360}})
    if cluster:
        raw = deep_merge(deep_merge(raw, load_raw("clusters/h800-80gb")), {"cluster": cluster})
    return recipe_from_dict(raw, "v3")


def test_the_preset_has_deepseek_v3s_sizes():
    from recipes.model.shape import count_parameters, mtp_parameters

    m = _v3().model
    main, active = count_parameters(m) - mtp_parameters(m), count_parameters(m, active=True) - mtp_parameters(m, True)
    assert main == pytest.approx(671e9, rel=0.005) and active == pytest.approx(37e9, rel=0.02)  # the report's
    # the release's 685B counts the depth with its copies of the embedding and head (2 x 129,280 x 7,168)
    assert mtp_parameters(m) + 2 * 129280 * V3_H == pytest.approx(14e9, rel=0.05)


def test_mla_attention_flops_and_activations_by_hand():
    from recipes.model.shape import attention_score_flops
    from recipes.planner.memory import mla_attention_terms

    m = _v3().model
    assert attention_score_flops(m) == 2 * S * V3_HEADS * (128 + 64 + 128)  # QK^T over 192 dims, scores x V over 128
    split, whole = mla_attention_terms(m)
    # bf16 bytes / (s b h): per head q and k (192 each), v and the attention output (128 each); the latents twice
    # (norm input and output: 1536 + 512) and the RoPE key (64), held whole on every TP rank
    assert split == pytest.approx(2 * 128 * (2 * 192 + 2 * 128) / V3_H)
    assert whole == pytest.approx(2 * (2 * (1536 + 512) + 64) / V3_H)
    assert mla_attention_terms(m, lean=True)[1] == pytest.approx(2 * (1536 + 512 + 64) / V3_H)


def test_mla_keys_and_values_gathered_under_context_parallelism():
    from recipes.planner.context import cp_kv_bytes

    m = _v3().model
    got = cp_kv_bytes(m, Layout(tp=2, cp=4, dp=1), act_bytes=2)
    assert got == S * 1 * (V3_HEADS / 2) * (192 + 128) * 2  # each head's key and value after the up-projections


def test_an_mtp_depth_adds_a_layer_its_projection_and_a_head():
    from recipes.model.shape import model_flops_per_step
    from recipes.planner.memory import params_per_gpu

    with_depth = _v3().model
    without = with_depth.model_copy(update={"mtp": None})
    h, v = V3_H, with_depth.padded_vocab_size(1)
    extra = model_flops_per_step(with_depth, 1) - model_flops_per_step(without, 1)
    # one MoE layer's active weights (attention, router, 8 experts, the shared expert) + eh_proj + the head, and
    # the layer's causal attention, x 3 (forward + backward) x 2 FLOPs per weight, per token
    mla = (1536 * h + 1536 * 128 * 192 + h * (512 + 64) + 512 * 128 * 256 + 128 * 128 * h)
    moe = 256 * h + 9 * 3 * 2048 * h
    per_token = 2 * (mla + moe + 2 * h * h + v * h) + 0.5 * 2 * S * 128 * 320
    assert extra == pytest.approx(3 * S * per_token, rel=1e-9)
    # the last stage holds the depth (its experts over EP) and a copy of the embedding
    tp, pp, ep = 1, 8, 16
    grown = params_per_gpu(with_depth, tp, pp, ep) - params_per_gpu(without, tp, pp, ep)
    depth = mla + 2 * (1536 + 512) // 2 + moe - 9 * 3 * 2048 * h + 3 * 2048 * h * (1 + 256 / ep) + 2 * h * h + 5 * h
    assert grown == pytest.approx(depth + v * h, rel=1e-6)


def test_plan_for_deepseeks_cluster_and_its_published_layout():
    """The planner's layout for 2,048 H800 (configs/examples/f-deepseek-v3-2048-h800.yaml), pinned within 3% as
    docs/moe.md states it; DeepSeek's PP16 x EP64 refused by the layout rules (stage 0 would hold only the dense
    layers: no expert param group, a ZeRO-1 hang) and priced slower by its cross-node all-to-alls."""
    from recipes.planner.calibration import assumptions_for
    from recipes.planner.cost import estimate
    from recipes.planner.search import plan_layouts

    recipe = _v3(nodes=256)
    assume, _ = assumptions_for(recipe.cluster)
    plan = plan_layouts(recipe.model, recipe.cluster, 15360, assume=assume)
    rec = next(e for e in plan if e.fits and not e.tight)
    lay = rec.layout
    assert (lay.tp, lay.pp, lay.dp, lay.ep, lay.zero_stage, lay.recompute) == (1, 8, 256, 16, 1, "full")
    assert rec.tokens_per_s == pytest.approx(1.55e6, rel=0.03) and rec.memory_gib["total"] < 67.1
    published = Layout(tp=1, pp=16, dp=128, ep=64, zero_stage=1, recompute="full")
    assert any("different optimizer param groups" in str(p) for p in published.problems(recipe.model, 15360))
    theirs = estimate(recipe.model, recipe.cluster, published, 15360, assume=assume)
    assert theirs.fits and theirs.tokens_per_s == pytest.approx(1.10e6, rel=0.03)
    assert theirs.terms.ep_comm > rec.terms.ep_comm  # EP64 spans 8 nodes: more of its all-to-all crosses them

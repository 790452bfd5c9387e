"""DeepSeek-V3 routing (recipes.model.deepseek_routing) in one process: the choice against transformers' own
DeepseekV3TopkRouter, the whole MoE layer (sigmoid routing over groups, routed scaling, shared expert) against
transformers' DeepseekV3MoE with the same weights and a non-zero score-correction bias, and aux-loss-free balancing:
a router started unbalanced is balanced by the bias update alone, and stays unbalanced without it."""
from __future__ import annotations

import pytest
import torch

from recipes.config.loading import recipe_from_dict

pytestmark = pytest.mark.unit

H, S, B, E = 32, 16, 3, 8
DEEPSEEK = dict(num_experts=E, top_k=2, ffn_hidden_size=24, score_function="sigmoid", num_groups=4, group_top_k=2,
                routed_scaling_factor=2.5, expert_bias=True, shared_expert_ffn_size=24, aux_loss_coeff=0.0)


def _recipe(**moe):
    return recipe_from_dict({"model": dict(num_layers=1, hidden_size=H, num_attention_heads=4, ffn_hidden_size=48,
                                           vocab_size=256, seq_length=S, moe={**DEEPSEEK, **moe}),
                             "training": {"global_batch": 1}})


def _layer(recipe, seed=7):
    from recipes.model.layers import transformer_config
    from recipes.model.moe import MoEMLP

    return MoEMLP(transformer_config(recipe.model, tp=1), layer_number=1, layer_seed=seed)


def _hf_config(moe):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(hidden_size=H, n_routed_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                            n_group=moe.num_groups, topk_group=moe.group_top_k, norm_topk_prob=moe.normalize_top_k,
                            routed_scaling_factor=moe.routed_scaling_factor, moe_intermediate_size=moe.ffn_hidden_size,
                            n_shared_experts=1, hidden_act="silu")


def test_sigmoid_top_k_equals_transformers_router():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from recipes.model.deepseek_routing import sigmoid_top_k

    moe = _recipe().model.moe
    ref = DeepseekV3TopkRouter(_hf_config(moe))
    torch.manual_seed(0)
    with torch.no_grad():
        ref.weight.normal_(0, 0.5)
        ref.e_score_correction_bias.normal_(0, 0.3)
    x = torch.randn(64, H)
    logits, want_w, want_i = ref(x)
    probs, routing_map = sigmoid_top_k(logits, moe.top_k, moe.num_groups, moe.group_top_k,
                                       ref.e_score_correction_bias, True, moe.routed_scaling_factor)
    assert torch.equal(routing_map, torch.zeros_like(routing_map).scatter(1, want_i, True))
    assert torch.allclose(probs.gather(1, want_i), want_w, rtol=1e-6)
    assert routing_map.sum(dim=1).eq(moe.top_k).all()
    no_bias, _ = sigmoid_top_k(logits, moe.top_k, moe.num_groups, moe.group_top_k, None, True, 2.5)
    assert not torch.equal(no_bias != 0, routing_map)  # the bias changed some choices (and only the choices)


def test_deepseek_moe_layer_equals_transformers(single_process_group):
    """Our MoE MLP with the router bias set equals transformers' DeepseekV3MoE (routed experts + shared expert)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    recipe = _recipe()
    ours = _layer(recipe).eval()
    with torch.no_grad():
        ours.router.weight.normal_(0, 0.5)
        ours.router.expert_bias.copy_(torch.linspace(-0.2, 0.3, E))
    ref = DeepseekV3MoE(_hf_config(recipe.model.moe)).eval()
    fc1, fc2 = ours.experts.linear_fc1.weight, ours.experts.linear_fc2.weight
    shared_gate, shared_up = ours.shared_experts.linear_fc1.weight.chunk(2, dim=0)
    with torch.no_grad():
        ref.gate.weight.copy_(ours.router.weight)
        ref.gate.e_score_correction_bias.copy_(ours.router.expert_bias)
        ref.experts.gate_up_proj.copy_(fc1)
        ref.experts.down_proj.copy_(fc2)
        ref.shared_experts.gate_proj.weight.copy_(shared_gate)
        ref.shared_experts.up_proj.weight.copy_(shared_up)
        ref.shared_experts.down_proj.weight.copy_(ours.shared_experts.linear_fc2.weight)
    x = torch.randn(S, B, H)
    got, _ = ours(x)
    want = ref(x.transpose(0, 1).contiguous()).transpose(0, 1)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()


def _imbalance_curve(update: bool, steps: int = 40, rate: float = 0.02) -> list[float]:
    """Busiest expert / mean load per step of a router whose weights favour experts 0 and 1 (fixed weights: only the
    bias can move the load), on fresh random tokens each step, through the training path (forward in training mode,
    then the step's bias update over the group of one rank)."""
    import torch.distributed as dist

    from recipes.model.deepseek_routing import update_expert_biases

    layer = _layer(_recipe(num_groups=None, group_top_k=None, bias_update_rate=rate)).train()
    torch.manual_seed(3)
    with torch.no_grad():
        layer.router.weight.normal_(0, 0.05)
        layer.router.weight[:2] += 0.1  # experts 0 and 1 score high for tokens of positive mean (all of them here)
    curve = []
    for _ in range(steps):
        layer(torch.randn(S, 16, H) + 0.5)  # 256 tokens; with autograd on, as in training: only training forwards are counted
        counts = layer.router.local_tokens_per_expert.clone()
        curve.append(float(counts.max() / counts.mean()))
        if update:
            update_expert_biases([layer.router], dist.group.WORLD, rate)
        else:
            layer.router.local_tokens_per_expert.zero_()
    return curve


def test_bias_update_balances_an_unbalanced_router(single_process_group):
    with_bias, without = _imbalance_curve(True), _imbalance_curve(False)
    assert with_bias[0] == without[0] > 2.5  # the same start: 2 of 8 experts take most of the top-2 choices
    late = sum(with_bias[-10:]) / 10  # balanced but for the sampling noise of 256 tokens and the bias's +-rate steps
    assert late < 1.6 < 3.5 < min(without[-10:]), (with_bias, without)


if __name__ == "__main__":  # the curves for docs/moe.md: python -m tests.training.test_deepseek_routing
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    for update in (True, False):
        print("with bias update" if update else "without", [round(v, 2) for v in _imbalance_curve(update)])

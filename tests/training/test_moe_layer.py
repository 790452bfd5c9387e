"""The MoE MLP (recipes.model.moe) in one process against a direct computation of what a mixture of experts is
(router softmax / top-k written out, each token through its experts one by one, as transformers' Mixtral and
Qwen2-MoE blocks do); dropped tokens against a direct count; the grouped GEMM against the per-expert loop; the
parameter count against the built model; and the rank order of megatron-core's expert groups against DeepSpeed's."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from recipes.config.loading import recipe_from_dict
from recipes.parallel.layout import Layout

pytestmark = pytest.mark.unit

H, S, B = 32, 16, 3


def _model(**moe):
    spec = dict(num_experts=4, top_k=2, ffn_hidden_size=24)
    spec.update(moe)
    return recipe_from_dict({"model": dict(num_layers=2, hidden_size=H, num_attention_heads=4, num_query_groups=2,
                                           ffn_hidden_size=48, vocab_size=256, seq_length=S, moe=spec),
                             "training": {"global_batch": 1}})


def _layer(recipe, seed=7):
    from recipes.model.layers import transformer_config
    from recipes.model.moe import MoEMLP

    return MoEMLP(transformer_config(recipe.model, tp=1), layer_number=1, layer_seed=seed)


def _swiglu(x, fc1, fc2):
    gate, up = (x @ fc1.t()).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ fc2.t()


def direct_moe(layer, x, moe) -> tuple[torch.Tensor, int]:
    """(output, dropped assignments): softmax over the experts, top-k (renormalized or not), at most `capacity`
    tokens per expert (the most probable kept), each token through its experts one at a time."""
    tokens = x.reshape(-1, H)
    probs = torch.softmax(tokens @ layer.router.weight.t(), dim=-1)
    top_p, top_i = probs.topk(moe.top_k, dim=-1)
    if moe.normalize_top_k:
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
    keep = torch.ones_like(top_p, dtype=torch.bool)
    dropped = 0
    if moe.capacity_factor is not None:
        capacity = math.ceil(tokens.shape[0] * moe.top_k / moe.num_experts * moe.capacity_factor)
        for e in range(moe.num_experts):
            where = (top_i == e).nonzero().tolist()
            where.sort(key=lambda tk: -float(top_p[tk[0], tk[1]]))
            for t, k in where[capacity:]:
                keep[t, k] = False
                dropped += 1
    out = torch.zeros_like(tokens)
    fc1, fc2 = layer.experts.linear_fc1.weight, layer.experts.linear_fc2.weight
    for t in range(tokens.shape[0]):
        for k in range(moe.top_k):
            if keep[t, k]:
                e = int(top_i[t, k])
                out[t] += top_p[t, k] * _swiglu(tokens[t], fc1[e], fc2[e])
    if layer.shared_experts is not None:
        shared = layer.shared_experts
        y = _swiglu(tokens, shared.linear_fc1.weight, shared.linear_fc2.weight)
        if shared.gate_weight is not None:
            y = y * torch.sigmoid(tokens @ shared.gate_weight.t())
        out = out + y
    return out.reshape(x.shape), dropped


CASES = {
    "mixtral-like (renormalized top-2)": {},
    "qwen2-moe-like (not renormalized, gated shared expert)": dict(normalize_top_k=False, shared_expert_ffn_size=40,
                                                                   shared_expert_gate=True),
    "top-1, capacity 1.0 (Switch-like, drops)": dict(top_k=1, normalize_top_k=False, capacity_factor=1.0),
    "top-2 of 8, capacity 0.5": dict(num_experts=8, capacity_factor=0.5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_moe_layer_equals_direct_computation(name, single_process_group):
    recipe = _model(**CASES[name])
    layer = _layer(recipe)
    layer.train()
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(3))
    out, bias = layer(x)
    assert bias is None
    ref, dropped = direct_moe(layer, x, recipe.model.moe)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    stats, _ = layer.take_stats()
    E = recipe.model.moe.num_experts
    assert int(stats[E]) == dropped, (int(stats[E]), dropped)  # dropped assignments counted = direct count
    assert int(stats[:E].sum()) + dropped == S * B * recipe.model.moe.top_k
    if recipe.model.moe.capacity_factor is not None:
        assert dropped > 0, "the case was meant to drop tokens"


def test_aux_loss_gradient_reaches_the_router(single_process_group):
    """The load-balancing loss enters the gradient like a loss term: router gradient of (sum of outputs) with the aux
    loss equals the one without it plus d(aux)/d(router), with aux recomputed directly (Switch formula)."""
    from recipes.model.moe import set_aux_loss_scale

    recipe = _model(aux_loss_coeff=0.5)
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(5))
    with_aux = _layer(recipe)
    no_aux = _layer(_model(aux_loss_coeff=0.0))
    set_aux_loss_scale(lambda: 1.0)
    for layer in (with_aux, no_aux):
        layer.train()
        layer(x)[0].sum().backward()
    w = no_aux.router.weight.detach().clone().requires_grad_()
    tokens = x.reshape(-1, H)
    probs = torch.softmax(tokens @ w.t(), dim=-1)
    counts = torch.zeros(4).scatter_add_(0, probs.topk(2, dim=-1).indices.reshape(-1), torch.ones(S * B * 2))
    T, E, k = S * B, 4, 2
    aux = 0.5 * E / (k * T * T) * (probs.sum(dim=0) * counts).sum()  # megatron-core's switch_load_balancing_loss
    aux.backward()
    torch.testing.assert_close(with_aux.router.weight.grad, no_aux.router.weight.grad + w.grad, rtol=1e-5, atol=1e-7)
    _, recorded = with_aux.take_stats()
    assert float(recorded[0] / recorded[1]) == pytest.approx(float(aux), rel=1e-5)


def test_grouped_gemm_equals_the_loop(single_process_group):
    """torch's grouped GEMM (the CUDA path) and the per-expert loop (CPU) give the same outputs and gradients."""
    recipe = _model(num_experts=4)
    layer = _layer(recipe).experts
    tokens = torch.randn(40, H, generator=torch.Generator().manual_seed(1))
    per_expert = [7, 0, 21, 12]  # an expert without tokens too
    probs = torch.rand(40, generator=torch.Generator().manual_seed(2))
    results = []
    for grouped in (False, True):
        layer.zero_grad()
        layer.use_grouped_mm = grouped
        x = tokens.clone().requires_grad_()
        out = layer(x, per_expert, probs)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), x.grad, layer.linear_fc1.weight.grad.clone(),
                        layer.linear_fc2.weight.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_expert_weights_do_not_depend_on_the_expert_split(single_process_group):
    """Each global expert draws from its own seed: the experts of 'EP rank 1 of 2' equal experts 2..3 of EP=1."""
    from recipes.model.layers import transformer_config
    from recipes.model.moe import GroupedExperts

    config = transformer_config(_model().model, tp=1)
    whole = GroupedExperts(config, 4, 0, layer_seed=11, tp=1, tp_rank=0, ep=1)
    second_half = GroupedExperts(config, 2, 2, layer_seed=11, tp=1, tp_rank=0, ep=2)
    assert torch.equal(whole.linear_fc1.weight[2:], second_half.linear_fc1.weight)
    assert torch.equal(whole.linear_fc2.weight[2:], second_half.linear_fc2.weight)
    assert second_half.linear_fc1.weight.allreduce is False and second_half.linear_fc1.weight.group_name == "ep_size_2"
    shard = GroupedExperts(config, 4, 0, layer_seed=11, tp=2, tp_rank=1, ep=1)  # TP rank 1: [gate_1; up_1] rows
    gate, up = whole.linear_fc1.weight.chunk(2, dim=1)
    torch.testing.assert_close(shard.linear_fc1.weight, torch.cat([gate.chunk(2, dim=1)[1], up.chunk(2, dim=1)[1]], 1))
    torch.testing.assert_close(shard.linear_fc2.weight, whole.linear_fc2.weight.chunk(2, dim=2)[1])


def test_parameter_count_equals_the_built_model(single_process_group):
    """shape.count_parameters (used by presets and the planner) counts exactly what PlainDecoder builds, with dense and
    MoE layers alternating and a gated shared expert; active parameters = total minus the unused experts."""
    from recipes.model.layers import PlainDecoder, count_model_parameters
    from recipes.model.shape import count_parameters

    recipe = _model(layer_pattern=[0, 1], shared_expert_ffn_size=40, shared_expert_gate=True)
    model = PlainDecoder(recipe, Layout())
    assert count_model_parameters(model) == count_parameters(recipe.model, tp=1)
    expert = 3 * H * 24
    assert count_parameters(recipe.model) - count_parameters(recipe.model, active=True) == (4 - 2) * expert


def test_mixtral_8x7b_counts_as_released():
    """Mixtral-8x7B: 46,702,792,704 parameters (the released checkpoint's count), 12.9B active per token."""
    from recipes.model.shape import count_parameters

    m = recipe_from_dict({"model": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                                        ffn_hidden_size=14336, vocab_size=32000, seq_length=4096,
                                        moe=dict(num_experts=8, top_k=2)),
                          "training": {"global_batch": 1}}).model
    assert count_parameters(m) == 46_702_792_704
    assert round(count_parameters(m, active=True) / 1e9, 1) == 12.9


@pytest.mark.parametrize("world,tp,ep,pp", [(8, 1, 2, 1), (8, 2, 2, 2), (16, 2, 4, 1), (32, 2, 4, 2), (8, 1, 4, 2)])
def test_expert_groups_agree_with_deepspeed(world, tp, ep, pp):
    """megatron-core's expert groups (what the dispatcher all-to-alls over) are the ranks DeepSpeed's own rule would
    give its expert-parallel and expert-data-parallel groups (what ZeRO reduces and partitions the experts over)."""
    from deepspeed.utils.groups import _get_expert_parallel_ranks
    from megatron.core.parallel_state import RankGenerator

    edp = world // (tp * pp) // ep
    ours = RankGenerator(tp=tp, ep=ep, dp=edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    ds_ep, ds_edp = _get_expert_parallel_ranks(world, tp, ep, pp)
    assert sorted(ours.get_ranks("ep")) == sorted(list(g) for g in ds_ep)
    assert sorted(ours.get_ranks("dp")) == sorted(list(g) for g in ds_edp)
    layout = Layout(tp=tp, pp=pp, dp=world // (tp * pp), ep=ep)
    for group in ours.get_ranks("ep"):  # Layout.expert_coords says the same: one DP slice, shards 0..ep-1 in order
        assert [layout.expert_coords(r)["ep"] for r in group] == list(range(ep))


@pytest.mark.parametrize("world,tp,cp,ep,pp", [(8, 1, 2, 2, 1), (16, 2, 2, 4, 1), (16, 1, 2, 2, 2), (8, 1, 4, 4, 1)])
def test_expert_coords_with_context_parallelism(world, tp, cp, ep, pp):
    """With CP, Layout.expert_coords names the EP / EDP groups megatron-core builds: initialize_model_parallel's expert
    rank generator (tp-ep-dp-pp over the same ranks, cp folded into dp), computed here the way megatron-core does."""
    from megatron.core.parallel_state import RankGenerator

    layout = Layout(tp=tp, pp=pp, dp=world // (tp * cp * pp), cp=cp, ep=ep)
    experts = RankGenerator(tp=tp, ep=ep, dp=world // (tp * ep * pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    for group in experts.get_ranks("ep"):
        assert [layout.expert_coords(r)["ep"] for r in group] == list(range(ep))
        assert len({layout.expert_coords(r)["edp"] for r in group}) == 1
    for group in experts.get_ranks("dp"):  # the expert-data-parallel group: one shard, edp 0..n-1
        assert len({layout.expert_coords(r)["ep"] for r in group}) == 1
        assert [layout.expert_coords(r)["edp"] for r in group] == list(range(len(group)))

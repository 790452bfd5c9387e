"""The MoE layer on a real GPU (skipped without CUDA; not yet run on one here): the experts' grouped GEMM (torch
`grouped_mm`, bf16, Hopper and newer) gives the per-expert loop's outputs and gradients, and a whole MoE decoder layer
runs forward and backward in bf16 on CUDA with the routing statistics counted."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _model():
    from recipes.config.loading import load_recipe

    return load_recipe("models/tiny", ["training.global_batch=8", "model.hidden_size=128", "model.moe.num_experts=8",
                                       "model.moe.top_k=2", "model.moe.ffn_hidden_size=64"]).model


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
                    reason="torch's grouped GEMM needs compute capability 9.0")
def test_grouped_gemm_matches_the_loop_on_cuda(tp1_group):
    from recipes.model.layers import transformer_config
    from recipes.model.moe import GroupedExperts

    experts = GroupedExperts(transformer_config(_model(), tp=1), 8, 0, layer_seed=3, tp=1, tp_rank=0,
                             ep=1).cuda().to(torch.bfloat16)
    tokens = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
    per_expert = [40, 0, 60, 20, 80, 30, 50, 20]
    probs = torch.rand(300, device="cuda")
    results = []
    for grouped in (False, True):
        experts.zero_grad()
        experts.use_grouped_mm = grouped
        x = tokens.clone().requires_grad_()
        out = experts(x, per_expert, probs)
        out.float().sum().backward()
        results.append((out.float(), x.grad.float(), experts.linear_fc1.weight.grad.float()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)  # bf16: a different order of additions


def test_moe_layer_runs_in_bf16_on_cuda(tp1_group):
    from recipes.model.layers import MoEDecoderLayerPipe, transformer_config

    m = _model()
    layer = MoEDecoderLayerPipe(transformer_config(m, tp=1), m, 1, seed=7).cuda().to(torch.bfloat16).train()
    x = torch.randn(m.seq_length, 2, m.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()
    assert torch.isfinite(x.grad).all() and layer.mlp.router.weight.grad is not None
    stats, _ = layer.mlp.take_stats()
    assert int(stats[:8].sum()) == m.seq_length * 2 * 2

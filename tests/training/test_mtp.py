"""Multi-token prediction (recipes.model.mtp) in one process: which tokens depth k embeds and predicts, the loss's
value (the main loss) and gradient (main + weight / D x the depths'), and the model's parameter count with depths.
The depths' forward against transformers' own MTP modules is in tests/interop/test_deepseek_interop.py."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.unit


def test_depth_k_embeds_token_i_plus_k_and_predicts_token_i_plus_k_plus_1():
    from recipes.model.mtp import depth_inputs, depth_targets

    x = torch.arange(10).unsqueeze(0)  # a sample of 10 tokens: inputs x[0:9], labels x[1:10]
    inputs, labels, mask = x[:, :9], x[:, 1:], torch.ones(1, 9)
    for k in (1, 2, 3):
        embedded = depth_inputs(labels, k)
        targets, target_mask = depth_targets(labels, mask, k)
        for i in range(9 - k):
            assert int(embedded[0, i]) == int(inputs[0, i]) + k  # x_{i+k}
            assert int(targets[0, i]) == int(inputs[0, i]) + k + 1 and target_mask[0, i] == 1  # x_{i+k+1}
        assert target_mask[0, 9 - k:].eq(0).all()  # no target past the sample's end


def test_mtp_loss_value_is_the_main_loss_and_its_gradient_the_objective(single_process_group):
    from recipes.model.layers import VocabParallelLoss
    from recipes.model.mtp import MTPLoss, depth_targets

    torch.manual_seed(0)
    s, b, v, depths, weight = 12, 2, 32, 2, 0.3
    labels, mask = torch.randint(0, v, (b, s)), torch.ones(b, s)
    raw = torch.randn((1 + depths) * s, b, v)
    logits = raw.clone().requires_grad_(True)
    loss = MTPLoss(VocabParallelLoss(v), depths, weight)(logits * 1.0, (labels, mask))  # (the CE works in place)
    loss.backward()
    ce = VocabParallelLoss(v)
    with torch.no_grad():
        main = ce(raw[:s].clone(), (labels, mask))
    assert torch.allclose(loss.detach(), main)
    ref = raw.clone().requires_grad_(True)
    parts = [ce(ref[k * s:(k + 1) * s].clone(), (labels, mask) if k == 0 else depth_targets(labels, mask, k))
             for k in range(1 + depths)]
    (parts[0] + weight / depths * sum(parts[1:])).backward()
    assert torch.allclose(logits.grad, ref.grad, atol=1e-7)
    assert logits.grad[s:].abs().sum() > 0  # the depths do train


def test_parameter_count_with_prediction_depths_equals_the_built_model(single_process_group):
    from recipes.config.loading import load_recipe
    from recipes.model.layers import PlainDecoder
    from recipes.model.shape import count_parameters, mtp_parameters
    from recipes.parallel.layout import Layout

    recipe = load_recipe("configs/runs/tiny-deepseek-cpu.yaml", ["model.mtp.num_layers=2"])
    model = PlainDecoder(recipe, Layout.from_recipe(recipe, 1))
    assert count_parameters(recipe.model) == sum(p.numel() for p in model.parameters())
    depth_params = sum(p.numel() for n, p in model.named_parameters() if int(n.split(".")[0]) > 6)
    assert mtp_parameters(recipe.model) == depth_params > 0

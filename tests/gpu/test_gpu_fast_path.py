"""The GPU fast path on a real GPU (skipped without CUDA): megatron-core's compiled fusions give the unfused layer's
output, SDPA picks a fused kernel for the 1.3B shape in bf16, and the fused non-finite check agrees with the
per-tensor loop on CUDA tensors."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("preset", ["tiny", "tiny-gpt"])
def test_compiled_fusions_match_the_unfused_layer(preset, tp1_group):
    from recipes.config.loading import load_recipe
    from recipes.model.layers import DecoderLayerPipe, transformer_config

    m = load_recipe(f"models/{preset}", ["training.global_batch=8"]).model
    out = {}
    for fused in (False, True):
        layer = DecoderLayerPipe(transformer_config(m, 1, fused=fused), m, 1, seed=7).cuda()
        x = torch.randn(m.seq_length, 2, m.hidden_size, generator=torch.Generator().manual_seed(1)).cuda()
        x.requires_grad_(True)
        y = layer(x)
        y.square().mean().backward()
        out[fused] = (y.detach(), x.grad)
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-3, atol=1e-5)


def test_sdpa_runs_a_fused_kernel_for_the_bench_shape_in_bf16():
    from recipes.model.fast_path import sdpa_backend

    backend = sdpa_backend(128, 16, 16, 2048, torch.bfloat16, torch.device("cuda"))
    print("SDPA backend:", backend)
    assert backend in ("flash", "cudnn", "efficient")


def test_fused_non_finite_check_on_cuda():
    from recipes.model.fast_path import any_non_finite

    dev = torch.device("cuda")
    ts = [torch.randn(1000, device=dev), torch.randn(7, 3, device=dev).bfloat16(), torch.full((5,), 3e38, device=dev)]
    assert any_non_finite(ts, dev).item() == 0.0
    ts[1][2, 1] = float("nan")
    assert any_non_finite(ts, dev).item() == 1.0
    ts[1][2, 1] = 0.0
    ts[0][999] = -float("inf")
    assert any_non_finite(ts, dev).item() == 1.0

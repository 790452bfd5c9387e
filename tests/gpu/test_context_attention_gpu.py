"""The CUDA kernels of context-parallel attention (skipped without CUDA): each CP rank's two chunks through the
two lower-right-causal SDPA calls (no document mask) and through compiled flex_attention (document mask), in bf16,
against full-sequence attention's rows at that rank's positions (fp32 math SDPA over the whole sequence).
The same functions are checked on CPU tensors in tests/recipes/test_context_parallel_unit.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recipes.model.context import chunk_positions
from recipes.model.context_attention import chunked_causal_attention, context_mask, flex_context_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _inputs(s=2048, b=2, heads=8, groups=2, d=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, heads, s, d, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(b, groups, s, d, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(b, groups, s, d, device="cuda", generator=g, dtype=torch.bfloat16)
    docs = torch.cumsum(torch.rand(b, s, device="cuda", generator=g) < 0.002, dim=1)  # ~4 documents per sample
    return q, k, v, docs


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("documents", [False, True])
def test_cuda_context_attention_equals_full_attention(cp, documents):
    q, k, v, docs = _inputs()
    s = q.shape[2]
    mask = context_mask(torch.arange(s, device="cuda"), s, docs if documents else None)
    full = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    for rank in range(cp):
        pos = chunk_positions(s, cp, rank, q.device)
        if documents:
            got = flex_context_attention(q[:, :, pos], k, v, pos, docs.clone())
        else:
            got = chunked_causal_attention(q[:, :, pos], k, v, cp, rank)
        torch.testing.assert_close(got.float(), full[:, :, pos], rtol=2e-2, atol=2e-2)

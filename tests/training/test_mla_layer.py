"""Multi-head latent attention (recipes.model.mla) in one process against transformers' own DeepseekV3Attention with
the same weights: causal, per-document (document masking: positions restart, attention stays within a document) and
without the query compression (q_lora_rank None); and its parameter count against recipes.model.shape.

transformers is the reference of record for what MLA computes (the layout of q_b_proj / kv_b_proj rows per head, the
shared RoPE key, the interleaved RoPE pairs, the softmax scale), so a wrong split, a RoPE on the wrong half or
non-interleaved pairs differ by O(1), far above the 1e-5 allowed here for fp32 summation order."""
from __future__ import annotations

import pytest
import torch

from recipes.config.loading import recipe_from_dict

pytestmark = pytest.mark.unit

H, HEADS, S, B = 32, 4, 12, 2
MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)


def _recipe(**mla):
    spec = {**MLA, **mla}
    return recipe_from_dict({"model": dict(num_layers=1, hidden_size=H, num_attention_heads=HEADS, ffn_hidden_size=48,
                                           vocab_size=256, seq_length=S, rotary_base=10000.0, mla=spec),
                             "training": {"global_batch": 1}})


def _ours(recipe):
    from recipes.model.layers import DecoderLayerPipe, transformer_config

    return DecoderLayerPipe(transformer_config(recipe.model, tp=1), recipe.model, 1, seed=11)


def _reference(recipe, ours):
    """transformers' DeepseekV3Attention holding our layer's weights (names: recipes.hf.deepseek's map)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    mla = recipe.model.mla
    cfg = DeepseekV3Config(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                           q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                           qk_nope_head_dim=mla.qk_nope_head_dim, qk_rope_head_dim=mla.qk_rope_head_dim,
                           v_head_dim=mla.v_head_dim, max_position_embeddings=S, rope_interleave=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"
    ref = DeepseekV3Attention(cfg, 0)
    a = ours.self_attention
    pairs = {"o_proj": a.linear_proj, "kv_a_proj_with_mqa": a.linear_kv_down_proj,
             "kv_a_layernorm": a.kv_layernorm, "kv_b_proj": a.linear_kv_up_proj}
    if mla.q_lora_rank is None:
        pairs["q_proj"] = a.linear_q_proj
    else:
        pairs.update(q_a_proj=a.linear_q_down_proj, q_a_layernorm=a.q_layernorm, q_b_proj=a.linear_q_up_proj)
    with torch.no_grad():
        for name, module in pairs.items():
            getattr(ref, name).weight.copy_(module.weight)
    return ref, DeepseekV3RotaryEmbedding(cfg)


def _reference_out(ref, rope, x, position_ids, mask):
    """x [s, b, h] -> transformers' attention output [s, b, h]."""
    xb = x.transpose(0, 1)
    cos, sin = rope(xb, position_ids)
    out, _ = ref(xb, (cos, sin), attention_mask=mask)
    return out.transpose(0, 1)


@pytest.mark.parametrize("q_lora_rank", [24, None])
def test_latent_attention_equals_transformers(q_lora_rank, single_process_group):
    recipe = _recipe(q_lora_rank=q_lora_rank)
    ours = _ours(recipe)
    ref, rope = _reference(recipe, ours)
    x = torch.randn(S, B, H)
    got, _ = ours.self_attention(x, attention_mask=None, rotary_pos_emb=ours._rope[:S])
    want = _reference_out(ref, rope, x, torch.arange(S).expand(B, S), None)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()


def test_document_masked_latent_attention_equals_transformers(single_process_group):
    """Two documents per sample: per-token RoPE positions (restarting at each document) and attention within it, as
    the decoder layer hands them to the attention; transformers gets the same positions and a block-diagonal mask."""
    from recipes.model.layers import document_causal_mask, document_ids

    recipe = _recipe()
    ours = _ours(recipe)
    ref, rope = _reference(recipe, ours)
    positions = torch.tensor([list(range(5)) + list(range(S - 5)), list(range(8)) + list(range(S - 8))])
    docs = document_ids(positions)
    x = torch.randn(S, B, H)
    angles = ours._rope[:, 0, 0, :][positions.t()].unsqueeze(2)  # what DecoderLayerPipe computes per token
    got, _ = ours.self_attention(x, attention_mask=docs, rotary_pos_emb=angles)
    mask = torch.zeros(B, 1, S, S).masked_fill(~document_causal_mask(docs), float("-inf"))
    want = _reference_out(ref, rope, x, positions, mask)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    plain, _ = ours.self_attention(x, attention_mask=None, rotary_pos_emb=ours._rope[:S])
    assert not torch.allclose(got, plain, atol=1e-3)  # the documents did change the attention


def test_mla_parameter_count_equals_the_built_model(single_process_group):
    from recipes.model.layers import PlainDecoder
    from recipes.model.shape import count_parameters
    from recipes.parallel.layout import Layout

    for q_lora_rank in (24, None):
        recipe = _recipe(q_lora_rank=q_lora_rank)
        model = PlainDecoder(recipe, Layout.from_recipe(recipe, 1))
        assert count_parameters(recipe.model) == sum(p.numel() for p in model.parameters())

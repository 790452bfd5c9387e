"""Multi-head latent attention (model.mla; DeepSeek-V2/V3) from megatron-core's tensor-parallel linears.

Why not megatron-core's `MLASelfAttention`: in 0.16.1 it cannot run on CPU ranks (its RoPE module is built with
`torch.cuda.current_device()` and moves its frequencies to CUDA at the first forward), it takes its positions from
its own RoPE module (0..s-1: no per-token positions for document masking, no context-parallel chunks of ours), and
without Transformer Engine its local spec splits the down-projections over TP instead of holding them whole. The
shapes, names and TP split below are megatron-core's (its TE spec), so checkpoints read like Megatron's.

Forward of one layer, hidden x [s, b, h] (n heads, n/t on this TP rank; dn, dr, dv = qk_nope, qk_rope, v head dims):
  q      = up_q(norm_q(down_q x))                [s, b, n/t, dn + dr]   (or one q projection: q_lora_rank None)
  latent, k_rope = down_kv x                     [s, b, kv_lora_rank], [s, b, dr] (one RoPE key for all heads)
  k_nope, v = up_kv(norm_kv(latent))             [s, b, n/t, dn], [s, b, n/t, dv]
  q = [q_nope; rope(q_rope)], k = [k_nope; rope(k_rope) for every head]; attention (SDPA) -> proj -> [s, b, h]

RoPE on the decoupled part rotates interleaved pairs (DeepSeek's layout: transformers' `rope_interleave`, megatron's
`multi_latent_attention` branch of apply_rotary_pos_emb, which this calls), with the fp32 angles the decoder layer
hands in (recipes.model.layers: per-token positions under document masking, this rank's chunks under CP). Softmax
scale 1/sqrt(dn + dr) (times YaRN's mscale^2 when model.rope_scaling is yarn).

Parameters (inside the decoder layer; TP dim "-" = every TP rank holds the whole tensor):

  | name                                        | full shape                 | TP dim |
  |---------------------------------------------|----------------------------|--------|
  | self_attention.linear_q_down_proj.weight    | [q_lora_rank, h]           | -      |
  | self_attention.q_layernorm.weight           | [q_lora_rank]              | -      |
  | self_attention.linear_q_up_proj.weight      | [n (dn + dr), q_lora_rank] | 0      |
  | self_attention.linear_q_proj.weight         | [n (dn + dr), h]           | 0      |  (q_lora_rank None: instead
                                                                                         of the three above)
  | self_attention.linear_kv_down_proj.weight   | [kv_lora_rank + dr, h]     | -      |
  | self_attention.kv_layernorm.weight          | [kv_lora_rank]             | -      |
  | self_attention.linear_kv_up_proj.weight     | [n (dn + dv), kv_lora_rank]| 0      |
  | self_attention.linear_proj.weight           | [h, n dv]                  | 1      |

Rows of the up-projections are grouped per head ([nope; rope] for q, [nope; v] for kv), as transformers' q_b_proj and
kv_b_proj: a TP shard holds n/t whole heads. Gradients of what every TP rank holds whole: without sequence
parallelism every rank computes the same down-projection of the same tokens and the up-projections' backward sums
over TP what flows into it (megatron's copy-to-TP region), so the copies stay equal; the shared RoPE key enters the
rank's heads only, so its gradient is summed over TP here. Under sequence parallelism each rank projects its slice
of the tokens, so the weights' gradients are summed over TP (as the norms').
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from data_prep.lazy_compile import import_with_compile_deferred

import_with_compile_deferred(("megatron.core",))  # its fusions compiled at their first call, not at this import
from megatron.core import tensor_parallel
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.transformer.module import MegatronModule


# The latent norms' epsilon: DeepSeek's reference code and transformers' DeepseekV3Attention build them with RMSNorm's
# default (1e-6) whatever rms_norm_eps says; megatron-core uses layernorm_epsilon (the same 1e-6 for DeepSeek-V3).
LATENT_NORM_EPS = 1e-6


def mla_config_kwargs(model_cfg) -> dict:
    """megatron-core MLATransformerConfig fields of model.mla (RoPE itself stays ours: the layer's fp32 tables, and
    with yarn the factor on cos / sin from these fields)."""
    mla, r = model_cfg.mla, model_cfg.rope_scaling
    kwargs = dict(multi_latent_attention=True, q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                  qk_head_dim=mla.qk_nope_head_dim, qk_pos_emb_head_dim=mla.qk_rope_head_dim,
                  v_head_dim=mla.v_head_dim, rope_type="rope", rotary_base=model_cfg.rotary_base)
    if r is not None and r.type == "yarn":
        kwargs.update(rope_type="yarn", rotary_scaling_factor=r.factor, mscale=r.mscale,
                      mscale_all_dim=r.mscale_all_dim, beta_fast=r.beta_fast, beta_slow=r.beta_slow,
                      original_max_position_embeddings=r.original_max_position_embeddings)
    return kwargs


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(model_cfg) -> float:
    """1 / sqrt(query head width), times YaRN's mscale(factor, mscale_all_dim)^2 (transformers' yarn_apply_mscale)."""
    mla = model_cfg.mla
    scale = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) ** -0.5
    r = model_cfg.rope_scaling
    if r is not None and r.type == "yarn" and r.mscale_all_dim:
        scale *= _yarn_mscale(r.factor, r.mscale_all_dim) ** 2
    return scale


def rope_mscale(config) -> float:
    """YaRN's factor on cos and sin (transformers' attention_factor) from megatron-core's MLA config; 1 without
    yarn."""
    if config.rope_type != "yarn":
        return 1.0
    factor, mscale, mscale_all_dim = config.rotary_scaling_factor, config.mscale, config.mscale_all_dim
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor)


def yarn_inv_freq(dim: int, base: float, r) -> torch.Tensor:
    """YaRN's inverse frequencies [dim / 2], op for op as transformers' `_compute_yarn_parameters` (truncate on):
    interpolated (divided by factor) below the correction range of beta_fast..beta_slow rotations over the original
    context, extrapolated (kept) above it, a linear ramp between."""
    def correction_dim(rotations):
        return (dim * math.log(r.original_max_position_embeddings / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(r.beta_fast)), 0)
    high = min(math.ceil(correction_dim(r.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (r.factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor


def _allreduce_over_tp(grad):
    from megatron.core import parallel_state

    grad = grad.clone()
    torch.distributed.all_reduce(grad, group=parallel_state.get_tensor_model_parallel_group())
    return grad


class ReplicatedLinear(nn.Module):
    """A bias-free linear layer every TP rank holds whole (MLA's down-projections; megatron-core's TE spec holds them
    "duplicated"). Initialised full-size from the layer's seed like the TP linears, so the weights do not depend on TP.
    Under sequence parallelism each rank sees 1/tp of the tokens: the gradient is summed over the TP group."""

    def __init__(self, config, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=config.params_dtype))
        with torch.no_grad():
            full = torch.empty(out_features, in_features, dtype=torch.float32)
            config.init_method(full)  # the draws megatron's CPU init makes for a full [out, in] weight
            self.weight.copy_(full)
        if config.sequence_parallel:
            self.weight.sequence_parallel = True
            self.weight.register_hook(_allreduce_over_tp)

    def forward(self, x):
        return F.linear(x, self.weight)


class LatentAttention(MegatronModule):
    """MLA self-attention with megatron-core's attention interface: (hidden [s, b, h], attention_mask = document ids
    or None, rotary_pos_emb = fp32 angles [s, 1|b, 1, dr]) -> (output [s, b, h], None)."""

    def __init__(self, config, layer_number: int, attn_mask_type=None, pg_collection=None, **_):
        super().__init__(config=config)
        from recipes.model.layers import SDPAttention, TorchNorm

        h, n, tp = config.hidden_size, config.num_attention_heads, config.tensor_model_parallel_size
        self.heads = n // tp
        self.dn, self.dr, self.dv = config.qk_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim
        self.kv_rank = config.kv_lora_rank
        self.sequence_parallel = config.sequence_parallel and tp > 1
        self.tp = tp

        def column(inp, out):
            return tensor_parallel.ColumnParallelLinear(inp, out, config=config, init_method=config.init_method,
                                                        bias=False, gather_output=False)

        q_width = n * (self.dn + self.dr)
        if config.q_lora_rank is None:
            self.linear_q_proj = column(h, q_width)
        else:
            self.linear_q_down_proj = ReplicatedLinear(config, h, config.q_lora_rank)
            self.q_layernorm = TorchNorm(config, config.q_lora_rank, LATENT_NORM_EPS)
            self.linear_q_up_proj = column(config.q_lora_rank, q_width)
        self.linear_kv_down_proj = ReplicatedLinear(config, h, self.kv_rank + self.dr)
        self.kv_layernorm = TorchNorm(config, self.kv_rank, LATENT_NORM_EPS)
        self.linear_kv_up_proj = column(self.kv_rank, n * (self.dn + self.dv))
        self.core_attention = SDPAttention(config, layer_number, attn_mask_type, "self",
                                           softmax_scale=config.softmax_scale)
        self.rope_mscale = rope_mscale(config)
        self.linear_proj = tensor_parallel.RowParallelLinear(
            n * self.dv, h, config=config, init_method=config.output_layer_init_method, bias=False,
            input_is_parallel=True, skip_bias_add=True)

    def _query(self, hidden):
        if hasattr(self, "linear_q_proj"):
            q, _ = self.linear_q_proj(hidden)
        else:
            q, _ = self.linear_q_up_proj(self.q_layernorm(self.linear_q_down_proj(hidden)))
        return q.view(*q.shape[:2], self.heads, self.dn + self.dr)

    def _shared_rope_key(self, k_rope):
        """The RoPE key every head of every TP rank uses: the whole sequence's (SP), its gradient summed over TP."""
        if self.sequence_parallel:
            return tensor_parallel.gather_from_sequence_parallel_region(k_rope)
        if self.tp > 1:
            return tensor_parallel.copy_to_tensor_model_parallel_region(k_rope)
        return k_rope

    def forward(self, hidden, attention_mask=None, rotary_pos_emb=None, **_):
        q_nope, q_rope = self._query(hidden).split([self.dn, self.dr], dim=-1)
        latent, k_rope = self.linear_kv_down_proj(hidden).split([self.kv_rank, self.dr], dim=-1)
        kv, _ = self.linear_kv_up_proj(self.kv_layernorm(latent))
        k_nope, value = kv.view(*kv.shape[:2], self.heads, self.dn + self.dv).split([self.dn, self.dv], dim=-1)
        k_rope = self._shared_rope_key(k_rope).unsqueeze(2)  # [s, b, 1, dr]
        if rotary_pos_emb is not None:
            q_rope = apply_rotary_pos_emb(q_rope, rotary_pos_emb, self.config, mscale=self.rope_mscale)  # pairs
            k_rope = apply_rotary_pos_emb(k_rope, rotary_pos_emb, self.config, mscale=self.rope_mscale)
        query = torch.cat([q_nope, q_rope], dim=-1)
        key = torch.cat([k_nope, k_rope.expand(-1, -1, self.heads, -1)], dim=-1)
        out = self.core_attention(query, key, value.contiguous(), attention_mask)
        return self.linear_proj(out)

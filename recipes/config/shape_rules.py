"""Model shapes the kernels cannot run, refused with the recipe (before any rank starts) instead of by a shape error
in megatron-core, our RoPE or torch's attention once every rank is up. Rules of the model alone (and its precision
and device); those that involve the layout (heads, query groups, FFN and expert sizes vs TP, the sequence vs CP)
are `recipes.parallel.layout.Layout.problems`'.

- attention heads: without model.head_dim, hidden_size / num_attention_heads must be whole (megatron-core's
  kv_channels = hidden // heads would silently drop the rest); num_attention_heads a multiple of num_query_groups
  (each KV group serves whole query heads);
- RoPE rotates pairs of channels: the head dim (kv_channels) must be even (megatron-core's apply_rotary_pos_emb
  splits each head into two halves; our rope table has head_dim / 2 frequencies);
- on CUDA in bf16/fp16, torch's flash, cuDNN and memory-efficient attention kernels need a head dim that is a
  multiple of 8 (up to 256): otherwise torch falls back to the math kernel (the s x s scores in memory), which
  recipes.model.fast_path refuses on every rank at start unless training.allow_math_attention is set.
Each problem is one line: the field, the values, a shape that works.
"""
from __future__ import annotations

FUSED_ATTENTION_ALIGN = 8  # channels: torch's fused SDPA kernels take 16-bit heads in multiples of 8
MAX_FLASH_HEAD_DIM = 256  # as recipes.model.fast_path's (above it no fused kernel exists and math is allowed)


def shape_problems(recipe) -> list[str]:
    m, tr = recipe.model, recipe.training
    out: list[str] = []
    heads, groups = m.num_attention_heads, m.query_groups
    if m.head_dim is None and m.hidden_size % heads:
        out.append(f"model.hidden_size={m.hidden_size} is not divisible by model.num_attention_heads={heads}; pick "
                   f"heads that divide it (e.g. {_divisor_near(m.hidden_size, heads)}), or set model.head_dim")
        return out  # the head dim below would be a guess
    if m.num_query_groups is not None and heads % groups:
        out.append(f"model.num_attention_heads={heads} is not divisible by model.num_query_groups={groups}; each KV "
                   f"group must serve whole heads (e.g. num_query_groups={_divisor_near(heads, groups)})")
    head_dim = m.kv_channels
    where = "model.head_dim" if m.head_dim else f"the head dim (hidden_size / num_attention_heads = " \
                                                f"{m.hidden_size} / {heads})"
    fused = recipe.cluster.device == "cuda" and tr.precision in ("bf16", "fp16") and not tr.allow_math_attention \
        and head_dim <= MAX_FLASH_HEAD_DIM
    need = FUSED_ATTENTION_ALIGN if fused else 2 if m.position_embedding == "rope" else 1
    if head_dim % need == 0:
        return out
    fix = f"use {_widths(m, need)}"
    if m.position_embedding == "rope" and head_dim % 2:
        out.append(f"{where} = {head_dim} is odd: RoPE rotates pairs of channels, so each head needs an even width; "
                   f"{fix}")
    else:
        out.append(f"{where} = {head_dim} is not a multiple of {FUSED_ATTENTION_ALIGN}: torch's flash, cuDNN and "
                   f"memory-efficient attention kernels take {tr.precision} heads in multiples of 8, so every rank "
                   f"would refuse the math kernel at start; {fix}, or set training.allow_math_attention=true to run "
                   "the slow kernel")
    return out


def _widths(m, multiple: int) -> str:
    """A change of one field that gives a head dim that is a multiple of ``multiple``."""
    if m.head_dim:
        return f"model.head_dim={_round_up(m.head_dim, multiple)}"
    heads = [h for h in range(1, m.hidden_size + 1) if m.hidden_size % h == 0 and (m.hidden_size // h) % multiple == 0
             and (m.num_query_groups is None or h % m.query_groups == 0)]
    if heads:
        return f"model.num_attention_heads={min(heads, key=lambda h: abs(h - m.num_attention_heads))}"
    return f"model.hidden_size={_round_up(m.kv_channels, multiple) * m.num_attention_heads}"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _divisor_near(n: int, target: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - target))

"""Model shapes the kernels cannot run, refused with the recipe (before any rank starts) instead of by a shape error
in megatron-core or our RoPE once every rank is up. Rules of the model alone; those that involve the layout (heads,
query groups, FFN and expert sizes vs TP, the sequence vs CP) are `recipes.parallel.layout.Layout.problems`'.

- attention heads: without model.head_dim, hidden_size / num_attention_heads must be whole (megatron-core's
  kv_channels = hidden // heads would silently drop the rest); num_attention_heads a multiple of num_query_groups
  (each KV group serves whole query heads);
- RoPE rotates pairs of channels: the head dim (kv_channels) must be even (megatron-core's apply_rotary_pos_emb
  splits each head into two halves; our rope table has head_dim / 2 frequencies).
Not a rule here: a head dim that is not a multiple of 8. torch's flash kernel pads it (its check is only <= 256 on
sm80-sm90); only the memory-efficient and cuDNN kernels need the alignment, and which kernel a GPU picks is checked
on the GPU itself at start (recipes.model.fast_path.check_attention_backend).
Each problem is one line: the field, the values, a shape that works.
"""
from __future__ import annotations


def shape_problems(recipe) -> list[str]:
    m = recipe.model
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
    if m.position_embedding == "rope" and head_dim % 2:
        where = "model.head_dim" if m.head_dim else f"the head dim (hidden_size / num_attention_heads = " \
                                                    f"{m.hidden_size} / {heads})"
        out.append(f"{where} = {head_dim} is odd: RoPE rotates pairs of channels, so each head needs an even width; "
                   f"use {_even_width(m)}")
    return out


def _even_width(m) -> str:
    """A change of one field that gives an even head dim."""
    if m.head_dim:
        return f"model.head_dim={m.head_dim + 1}"
    heads = [h for h in range(1, m.hidden_size + 1) if m.hidden_size % h == 0 and (m.hidden_size // h) % 2 == 0
             and (m.num_query_groups is None or h % m.query_groups == 0)]
    if heads:
        return f"model.num_attention_heads={min(heads, key=lambda h: abs(h - m.num_attention_heads))}"
    return f"model.hidden_size={(m.kv_channels + 1) * m.num_attention_heads}"


def _divisor_near(n: int, target: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - target))

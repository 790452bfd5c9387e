"""Causal (and document-causal) attention under context parallelism: each CP rank holds the queries, keys and values
of its two sequence chunks (recipes.model.context) and attends to the keys and values of the whole sequence.

Gather, not ring. Each rank all-gathers the keys and values over the CP group (one collective per layer, K and V
together), puts them back in sequence order and attends with its own queries. This is Llama 3's choice: with GQA the
keys and values are a fraction of the queries (2 x groups / heads: 1/4 for Llama 3 8B, 1/8 for 405B), so the gather
moves little and its memory (the full sequence's K and V of one layer, freed after the layer's backward) is small
next to the activations CP saves; the document mask stays a plain mask over global positions, where a ring would have
to pass document boundaries and causal offsets around with each block. The gather is not overlapped with compute
here (a ring can hide its transfers behind the blocks' attention); the backward of the gather is a reduce-scatter
that returns to each rank the gradients of its keys and values from every rank's queries.

Kernels. CPU: torch SDPA with a boolean [b, 1, s/cp, s] mask (causal over global positions, within documents when
model.document_mask), built once per micro-batch. CUDA: without document masks, two SDPA calls, one per local chunk,
each over the key prefix it can see with a lower-right causal mask (`causal_lower_right`: flash / memory-efficient
kernels, no mask in memory, no work on the future); with document masks, flex_attention over a block mask of the
local queries' global positions (tiles that are empty are skipped). `chunked_causal_attention` and
`flex_context_attention` run on CPU tensors too, and the unit tests compare them with the masked path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from recipes.model.context import chunk_positions

_all_gather = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
_reduce_scatter = (getattr(torch.distributed, "reduce_scatter_single", None)
                   or torch.distributed.reduce_scatter_tensor)


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over `group` (rank order); backward: reduce-scatter of the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((group.size() * x.shape[0], *x.shape[1:]))
        _all_gather(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.shape[0] // ctx.group.size(), *grad.shape[1:]))
        _reduce_scatter(out, grad.contiguous(), group=ctx.group)
        return out, None


def _sequence_order(seq_length: int, cp: int, device) -> torch.Tensor:
    """Indices that put the gathered rows (rank 0's two chunks, rank 1's, ...) back in sequence order."""
    gathered = torch.cat([chunk_positions(seq_length, cp, r, device) for r in range(cp)])
    return torch.argsort(gathered)


def gather_keys_values(key, value, group):
    """Local key/value [s/cp, b, groups, d] -> the whole sequence's [s, b, groups, d], in sequence order (key and
    value may differ in d: MLA's values are narrower than its keys)."""
    cp = group.size()
    both = _GatherSequence.apply(torch.cat([key, value], dim=3), group)
    both = both.index_select(0, _sequence_order(both.shape[0], cp, both.device))
    return both.split([key.shape[3], value.shape[3]], dim=3)


def context_mask(q_positions: torch.Tensor, seq_length: int, docs: torch.Tensor | None) -> torch.Tensor:
    """Boolean SDPA mask (True = attend) of local queries at global `q_positions` [s/cp] over all `seq_length` keys:
    [s/cp, s] causal, or [b, 1, s/cp, s] causal within documents (`docs` [b, s], document index of every token)."""
    causal = q_positions[:, None] >= torch.arange(seq_length, device=q_positions.device)[None, :]
    if docs is None:
        return causal
    q_docs = docs.index_select(1, q_positions)
    return (q_docs[:, None, :, None] == docs[:, None, None, :]) & causal


def chunked_causal_attention(q, k, v, cp: int, rank: int, scale=None, dropout: float = 0.0):
    """q [b, heads, s/cp, d] (this rank's two chunks), k/v [b, groups, s, d] in sequence order: one SDPA call per
    chunk over the keys up to its end, lower-right causal (the flash path on CUDA)."""
    from torch.nn.attention.bias import causal_lower_right

    c = q.shape[2] // 2
    outs = []
    for half, chunk in enumerate((rank, 2 * cp - 1 - rank)):
        seen = (chunk + 1) * c
        outs.append(F.scaled_dot_product_attention(
            q[:, :, half * c:(half + 1) * c], k[:, :, :seen], v[:, :, :seen], attn_mask=causal_lower_right(c, seen),
            dropout_p=dropout, scale=scale, enable_gqa=q.shape[1] != k.shape[1]))
    return torch.cat(outs, dim=2)


_compiled_flex = None


def flex_context_attention(q, k, v, q_positions, docs, scale=None, compiled: bool = True):
    """Document-causal attention of local queries over the whole sequence through flex_attention (the CUDA path)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def same_document_causal(b, h, q_idx, kv_idx):
        q_at = q_positions[q_idx]
        return (docs[b, q_at] == docs[b, kv_idx]) & (q_at >= kv_idx)

    fn = flex_attention
    if compiled:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        fn = _compiled_flex
    mask = _per_micro_batch(docs, "_cp_block_mask", lambda: create_block_mask(
        same_document_causal, B=docs.shape[0], H=None, Q_LEN=q.shape[2], KV_LEN=k.shape[2], device=docs.device))
    return fn(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def _per_micro_batch(t: torch.Tensor, name: str, make):
    """`make()` once per micro-batch, kept on the micro-batch's document-id tensor `t` (shared by a stage's layers)."""
    cached = getattr(t, name, None)
    if cached is None:
        cached = make()
        setattr(t, name, cached)
    return cached


_CAUSAL_MASKS: dict = {}


def context_parallel_attention(query, key, value, docs, scale=None, dropout: float = 0.0):
    """megatron-core's core-attention shapes in and out: query [s/cp, b, heads, d], key/value [s/cp, b, groups, d]
    (this rank's chunks, RoPE applied at their global positions), `docs` [b, s] document ids of the whole sequence
    or None; returns [s/cp, b, heads * d]."""
    from megatron.core import parallel_state

    group = parallel_state.get_context_parallel_group()
    cp, rank = group.size(), parallel_state.get_context_parallel_rank()
    key, value = gather_keys_values(key, value, group)
    s_local, b, s = query.shape[0], query.shape[1], key.shape[0]
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # -> [b, heads, s, d]
    q_positions = chunk_positions(s, cp, rank, q.device)
    if q.is_cuda and dropout == 0.0:
        out = (chunked_causal_attention(q, k, v, cp, rank, scale) if docs is None
               else flex_context_attention(q, k, v, q_positions, docs, scale))
    else:
        if docs is None:
            key_ = (s, cp, rank, str(q.device))
            mask = _CAUSAL_MASKS.get(key_)
            if mask is None:
                mask = _CAUSAL_MASKS[key_] = context_mask(q_positions, s, None)
        else:
            mask = _per_micro_batch(docs, "_cp_sdpa_mask", lambda: context_mask(q_positions, s, docs))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
    return out.permute(2, 0, 1, 3).reshape(s_local, b, -1)

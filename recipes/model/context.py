"""Context parallelism (`parallel.cp`): the sequence of every micro-batch split over the CP ranks.

Load balance. The sequence is cut into 2 x cp equal chunks and CP rank i holds chunks i and 2cp-1-i (Megatron's and
Llama 3's split): under a causal mask chunk j attends to j + 1 chunks' keys, so every rank does (i + 1) + (2cp - i) =
2cp + 1 chunk-sized pieces of attention work, the same on every rank.

Where the split happens: inside the model, where the batch enters it. Every CP rank of a data-parallel replica reads
the same full micro-batch (tokens [b, s], labels, loss mask, position ids: a few integers per token); the embedding
keeps this rank's tokens (`local_part`), the loss keeps this rank's labels, and the position ids travel whole through
the pipeline so that every decoder layer finds its tokens' RoPE positions and document ids (`local_positions`, and
recipes.model.context_attention for the mask). The data path and the training loop do not know CP exists.

How DeepSpeed sees it. CP ranks hold the same parameters, and the gradient of a micro-batch is the sum of the CP ranks'
contributions (each rank's tokens, with the K/V gather's backward returning the gradients of the keys and values other
ranks used). So CP is one more data-parallel axis for DeepSpeed (data = DP x CP: its gradient averaging, ZeRO
sharding and checkpoint files all run over DP x CP; recipes.parallel.layout). Averaging over DP x CP divides by cp a
sum that must not be divided: `mean_over_context` returns the rank's token-loss sum times cp, over the number of real
tokens in the whole CP group, as the differentiated part, while its value is the full micro-batch's mean loss on every
CP rank (so logged losses need no CP reduction).
"""
from __future__ import annotations

import torch

_INDEX_CACHE: dict = {}


def context_parallel_size() -> int:
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_context_parallel_world_size()


def _rank_and_group():
    from megatron.core import parallel_state

    return parallel_state.get_context_parallel_rank(), parallel_state.get_context_parallel_group()


def chunk_positions(seq_length: int, cp: int, rank: int, device: torch.device) -> torch.Tensor:
    """Global positions [s / cp] of CP rank `rank`'s tokens: chunk `rank`, then chunk 2cp-1-rank (cached)."""
    key = (seq_length, cp, rank, str(device))
    idx = _INDEX_CACHE.get(key)
    if idx is None:
        if seq_length % (2 * cp):
            raise ValueError(f"sequence length {seq_length} is not divisible by 2 x cp = {2 * cp}")
        c = seq_length // (2 * cp)
        first, second = rank * c, (2 * cp - 1 - rank) * c
        idx = torch.cat([torch.arange(first, first + c), torch.arange(second, second + c)]).to(device)
        _INDEX_CACHE[key] = idx
    return idx


def local_positions(seq_length: int, device: torch.device) -> torch.Tensor | None:
    """This rank's global token positions within a sequence of `seq_length`; None without CP (all of them, in order)."""
    cp = context_parallel_size()
    if cp == 1:
        return None
    rank, _ = _rank_and_group()
    return chunk_positions(seq_length, cp, rank, device)


def local_part(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """This CP rank's tokens of a per-token tensor ([b, s] with dim=1): unchanged without CP."""
    idx = local_positions(t.shape[dim], t.device)
    return t if idx is None else t.index_select(dim, idx)


def mean_over_context(loss_sum: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean token loss of a micro-batch from this rank's sum of token losses and its count of real tokens.

    Without CP: sum / count. With CP the value is the whole micro-batch's mean (the sum and count all-reduced over
    the CP group, detached); the gradient is cp x d(local sum) / (total count), which DeepSpeed's average over
    DP x CP turns into the micro-batch's true gradient (see the module docstring)."""
    cp = context_parallel_size()
    if cp == 1:
        return loss_sum / tokens.clamp(min=1.0)
    _, group = _rank_and_group()
    totals = torch.stack([loss_sum.detach().float(), tokens.detach().float()])
    torch.distributed.all_reduce(totals, group=group)
    scaled = loss_sum * cp
    return (scaled - scaled.detach() + totals[0]) / totals[1].clamp(min=1.0)

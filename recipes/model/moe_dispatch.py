"""Token dispatch for expert parallelism: send each token to the ranks holding its experts and bring the results back.

megatron-core's `MoEAlltoAllTokenDispatcher` does the same with the same steps, but allocates its buffers with
`torch.cuda.current_device()` and synchronises on CUDA streams, so it cannot run on CPU ranks; its all-gather
dispatcher needs the CUDA global memory buffer. This one is device-agnostic and uses ONE collective,
`all_to_all_single` with uneven splits (gloo has it on CPU; gloo's all_gather refuses uneven sizes), for every
exchange: the expert-parallel all-to-all and, when experts are split over TP, the TP all-gather / reduce-scatter of
the tokens. The bookkeeping (split sizes, chunk order, megatron-core's `permute` / `unpermute` /
`sort_chunks_by_idxs`) follows megatron-core's dispatcher step for step, so the expert sees the same tokens in the
same order.

Steps (T local tokens, E experts, n = E / ep local experts, tp = expert TP degree = TP):
  1. permute: tokens sorted by expert (each token once per chosen expert)       [sum(routing_map), h]
  2. all-to-all over EP: each EP rank gets the tokens of its n experts           (from every EP rank of its TP index)
  3. all-gather over TP: every TP rank of the experts sees the same tokens      (experts are TP-sharded)
  4. sort the chunks (source rank, expert) -> (expert, source rank)             experts run on contiguous tokens
  ... experts ...; then 4-1 reversed: unsort, reduce-scatter over TP (sums the TP partial outputs), all-to-all back,
  unpermute (each token's expert outputs summed; the router probabilities were applied inside the experts).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from data_prep.lazy_compile import import_with_compile_deferred

import_with_compile_deferred(("megatron.core",))  # its fusions compiled at their first call, not at this import
from megatron.core.transformer.moe.moe_utils import permute, sort_chunks_by_idxs, unpermute


def _size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _exchange(x: torch.Tensor, output_splits: list[int], input_splits: list[int], group) -> torch.Tensor:
    out = x.new_empty([sum(output_splits), *x.shape[1:]])
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=output_splits, input_split_sizes=input_splits,
                           group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Uneven all-to-all along dim 0; backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits, ctx.group = (output_splits, input_splits), group
        return _exchange(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        return _exchange(grad, input_splits, output_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int], group) -> torch.Tensor:
    if _size(group) == 1:
        return x
    return _AllToAll.apply(x, output_splits, input_splits, group)


def _gather_v(x: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    rank = dist.get_rank(group)
    return _exchange(x.repeat(len(sizes), *([1] * (x.dim() - 1))), sizes, [sizes[rank]] * len(sizes), group)


def _reduce_scatter_v(x: torch.Tensor, sizes: list[int], group) -> torch.Tensor:
    rank = dist.get_rank(group)
    parts = _exchange(x, [sizes[rank]] * len(sizes), sizes, group)  # every rank's partial of my chunk
    return torch.stack(parts.chunk(len(sizes), dim=0)).sum(dim=0)  # in rank order: the same sum on every run


class _GatherV(torch.autograd.Function):
    """All-gather of uneven chunks along dim 0 (rank order); backward reduce-scatters: each rank's chunk gets the sum
    of the gradients every rank computed for it (the experts after it are TP-sharded, so those are partial)."""

    @staticmethod
    def forward(ctx, x, sizes, group):
        ctx.sizes, ctx.group = sizes, group
        return _gather_v(x, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_v(grad, ctx.sizes, ctx.group), None, None


class _ReduceScatterV(torch.autograd.Function):
    """Sum over ranks, then each rank keeps its (uneven) chunk; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, sizes, group):
        ctx.sizes, ctx.group = sizes, group
        return _reduce_scatter_v(x, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_v(grad, ctx.sizes, ctx.group), None, None


class _ScatterSequence(torch.autograd.Function):
    """[s, b, h] replicated over TP -> this rank's [s/tp, b, h] slice; backward gathers the slices' gradients (the
    layers before run replicated over TP and need the whole gradient)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.chunk(dist.get_world_size(group), dim=0)[dist.get_rank(group)].contiguous()

    @staticmethod
    def backward(ctx, grad):
        n = dist.get_world_size(ctx.group)
        return _gather_v(grad, [grad.shape[0]] * n, ctx.group), None


class _GatherSequence(torch.autograd.Function):
    """Inverse of `_ScatterSequence`: the slices back to the replicated [s, b, h]; backward keeps this rank's slice
    of the (replicated, identical) gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_v(x, [x.shape[0]] * dist.get_world_size(group), group)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size(ctx.group), dim=0)[dist.get_rank(ctx.group)].contiguous(), None


def scatter_sequence(x: torch.Tensor, group) -> torch.Tensor:
    return x if _size(group) == 1 else _ScatterSequence.apply(x, group)


def gather_sequence(x: torch.Tensor, group) -> torch.Tensor:
    return x if _size(group) == 1 else _GatherSequence.apply(x, group)


class AllToAllDispatcher:
    """Dispatch / combine for one MoE layer. `dispatch` returns the tokens of this rank's experts (grouped by local
    expert), how many each expert got, and their router probabilities; `combine` takes the experts' output in that
    order and returns [T, h] in the original token order. One dispatch, then one combine, per forward."""

    def __init__(self, num_experts: int, ep_group, tp_group, tp_ep_group):
        self.num_experts = num_experts
        self.ep_group, self.tp_group, self.tp_ep_group = ep_group, tp_group, tp_ep_group
        self.ep, self.tp = _size(ep_group), _size(tp_group)
        self.ep_rank = dist.get_rank(ep_group) if self.ep > 1 else 0
        self.tp_rank = dist.get_rank(tp_group) if self.tp > 1 else 0
        self.num_local = num_experts // self.ep
        chunks = torch.arange(num_experts * self.tp)
        # chunks arrive ordered (TP source, EP source, local expert); the experts want (local expert, sources)
        self.sort_by_expert = chunks.reshape(-1, self.num_local).T.ravel()
        self.restore_order = chunks.reshape(self.num_local, -1).T.ravel()

    @property
    def local_experts(self) -> range:
        return range(self.ep_rank * self.num_local, (self.ep_rank + 1) * self.num_local)

    def _splits(self, per_expert: torch.Tensor) -> None:
        """Split sizes of every exchange, from the token counts of every rank (one small all-gather)."""
        n = self.num_local
        self.input_splits = per_expert.reshape(self.ep, n).sum(dim=1).tolist()  # what I send to each EP rank
        if self.ep * self.tp > 1:
            counts = per_expert.new_empty(self.ep * self.tp, self.num_experts)
            dist.all_gather(list(counts.unbind(0)), per_expert, group=self.tp_ep_group)  # (ep, tp) order, tp fastest
            counts = counts.reshape(self.ep, self.tp, self.num_experts).transpose(0, 1)  # [tp, ep, E]
        else:
            counts = per_expert.reshape(1, 1, self.num_experts)
        mine = counts[:, :, self.ep_rank * n:(self.ep_rank + 1) * n]  # [tp, ep, n]: sent to my experts
        self.output_splits = mine[self.tp_rank].sum(dim=1).tolist()  # what each EP rank sends me
        self.tp_splits = mine.sum(dim=(1, 2)).tolist()  # what each TP rank of mine received
        self.chunk_sizes = mine.reshape(-1, n)  # [(tp, ep), n]
        self.tokens_per_expert = mine.sum(dim=(0, 1)).tolist()

    def dispatch(self, hidden: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor):
        """hidden [T, h], probs / routing_map [T, E] -> (tokens [N, h], tokens per local expert, probs [N])."""
        self.hidden_shape = hidden.shape
        self.routing_map = routing_map
        self._splits(routing_map.sum(dim=0).long())
        tokens, token_probs, self.sorted_indices = permute(hidden, routing_map, probs=probs,
                                                           num_out_tokens=int(routing_map.sum()))
        tokens = all_to_all(tokens, self.output_splits, self.input_splits, self.ep_group)
        token_probs = all_to_all(token_probs, self.output_splits, self.input_splits, self.ep_group)
        if self.tp > 1:
            tokens = _GatherV.apply(tokens, self.tp_splits, self.tp_group)
            token_probs = _GatherV.apply(token_probs, self.tp_splits, self.tp_group)
        if self.num_local > 1:
            tokens, token_probs = sort_chunks_by_idxs(tokens, self.chunk_sizes.ravel(), self.sort_by_expert,
                                                      probs=token_probs)
        return tokens, self.tokens_per_expert, token_probs

    def combine(self, expert_output: torch.Tensor) -> torch.Tensor:
        """Experts' output [N, h] (dispatch order) -> [T, h] in token order, each token's experts summed."""
        if self.num_local > 1:
            expert_output, _ = sort_chunks_by_idxs(expert_output, self.chunk_sizes.T.ravel(), self.restore_order)
        if self.tp > 1:
            expert_output = _ReduceScatterV.apply(expert_output, self.tp_splits, self.tp_group)
        expert_output = all_to_all(expert_output, self.input_splits, self.output_splits, self.ep_group)
        out = unpermute(expert_output, self.sorted_indices, restore_shape=self.hidden_shape,
                        routing_map=self.routing_map)
        self.routing_map = self.sorted_indices = None
        return out

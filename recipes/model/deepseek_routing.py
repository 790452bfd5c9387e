"""DeepSeek-V3 routing (model.moe.score_function = sigmoid) and its auxiliary-loss-free load balancing.

Routing of T tokens over E experts (DeepSeek-V3 report, Section 2.1.2; transformers' DeepseekV3TopkRouter op for op):
  s = sigmoid(router logits)                                      [T, E], each expert scored on its own
  choice = s + b                                                  b: the per-expert bias (model.moe.expert_bias)
  with num_groups: each group of E / num_groups experts scored by the sum of its 2 best `choice` values; a token
  keeps its group_top_k best groups, the other experts are out of the running
  the top_k experts by `choice`; their weights are s (not s + b: the bias only chooses), renormalized to sum to 1
  when model.moe.normalize_top_k, times model.moe.routed_scaling_factor.
megatron-core's router does the same but scores a group by its top (top_k / group_top_k) experts (2 for V3's 8 / 4,
not for other shapes) and always renormalizes, so this path is ours, inside megatron-core's `TopKRouter` (its
capacity dropping, its aux losses, its bias counting).

Aux-loss-free balancing (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"):
every training forward adds the tokens each expert got to the router's `local_tokens_per_expert`; after the step's
last micro-batch `update_expert_biases` sums those counts over every rank that routed tokens of the layer (one
all-reduce of all of a stage's layers over its TP x CP x DP group: TP and CP ranks route disjoint slices of the
sequence, DP ranks disjoint samples, EP ranks are DP ranks) and moves each bias by `bias_update_rate` towards the
mean: up for an expert below the mean load, down above it (sign of mean - load; an expert exactly at the mean stays).
Every rank computes the same update from the same sums, so the biases stay identical everywhere. The bias is an
fp32 buffer of the router (`expert_bias`, transformers' `e_score_correction_bias`): in the checkpoint's module state,
resumed with it.
"""
from __future__ import annotations

import torch

from data_prep.lazy_compile import import_with_compile_deferred

import_with_compile_deferred(("megatron.core",))  # its fusions compiled at their first call, not at this import
from megatron.core.transformer.moe.moe_utils import apply_router_token_dropping, compute_routing_scores_for_aux_loss


def sigmoid_top_k(logits: torch.Tensor, top_k: int, num_groups: int | None, group_top_k: int | None,
                  bias: torch.Tensor | None, normalize: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (probs [T, E]: the chosen experts' weights, 0 elsewhere; routing_map [T, E] bool)."""
    scores = torch.sigmoid(logits.float())
    choice = scores if bias is None else scores + bias
    if num_groups:
        tokens, experts = choice.shape
        group_scores = choice.view(tokens, num_groups, -1).topk(2, dim=-1)[0].sum(dim=-1)
        groups = group_scores.topk(group_top_k, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, groups, True)
        keep = keep.unsqueeze(-1).expand(tokens, num_groups, experts // num_groups).reshape(tokens, experts)
        choice = choice.masked_fill(~keep, float("-inf"))
    top = choice.topk(top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, top)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    weights = (weights * scaling).type_as(logits)
    probs = torch.zeros_like(logits).scatter(1, top, weights)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top, True)
    return probs, routing_map


def sigmoid_routing(router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """megatron-core's `TopKRouter.routing` with `sigmoid_top_k` as the choice: logits [s, b, E] ->
    (probs [s b, E], routing_map [s b, E])."""
    config = router.config
    seq_length, bsz = logits.shape[:2]
    logits = router.apply_z_loss(logits.view(-1, config.num_moe_experts))
    probs, routing_map = sigmoid_top_k(logits, router.topk, config.moe_router_num_groups,
                                       config.moe_router_group_topk, router.expert_bias, router.normalize_top_k,
                                       config.moe_router_topk_scaling_factor or 1.0)
    if config.moe_expert_capacity_factor is not None:
        probs, routing_map = apply_router_token_dropping(
            probs, routing_map, router_topk=router.topk, capacity_factor=config.moe_expert_capacity_factor,
            drop_policy=config.moe_token_drop_policy, pad_to_capacity=config.moe_pad_expert_input_to_capacity)
    if router.training and torch.is_grad_enabled() and router.is_aux_loss_enabled():
        aux_map, aux_scores = compute_routing_scores_for_aux_loss(logits, router.topk, "sigmoid")
        probs = router._apply_aux_loss(probs, aux_scores, aux_map)
        probs = router._apply_seq_aux_loss(probs, aux_scores, aux_map, seq_length, bsz)
    router._apply_expert_bias(routing_map)
    return probs, routing_map


def add_bias_buffers(router, num_experts: int) -> None:
    """The router's fp32 bias and its token counts, on the CPU (megatron-core makes them on the current CUDA device);
    the counts are not saved (they cover one step)."""
    for name in ("local_tokens_per_expert", "expert_bias"):
        router.__dict__.pop(name, None)  # megatron-core's None placeholders
    router.register_buffer("local_tokens_per_expert", torch.zeros(num_experts, dtype=torch.float32), persistent=False)
    router.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32))


@torch.no_grad()
def update_expert_biases(routers: list, group, rate: float) -> None:
    """One step of aux-loss-free balancing for `routers` (a pipeline stage's, in layer order): their token counts
    summed over `group` (one all-reduce), each bias moved by rate x sign(mean load - load), the counts reset.
    Collective: every rank of `group` calls it with the same layers."""
    if not routers:
        return
    counts = torch.stack([r.local_tokens_per_expert for r in routers]).double()  # exact beyond 2^24 tokens
    torch.distributed.all_reduce(counts, group=group)
    step = rate * torch.sign(counts.mean(dim=-1, keepdim=True) - counts)
    for router, delta in zip(routers, step):
        router.expert_bias.data = router.expert_bias.data.float() + delta.float().to(router.expert_bias.device)
        router.local_tokens_per_expert.zero_()

"""Tensor-parallel shard rules of our parameter names: merge TP shards into full tensors and cut full tensors into the
shards of any TP degree; strip / re-pad the vocabulary.

The "canonical" full state used by export, import and reshape is keyed by the pipeline-layer names of
`recipes.model.layers` ("0.word_embeddings.weight", "3.self_attention.linear_qkv.weight", "6.output_layer.weight", ...)
with the vocabulary padding removed (rows >= model.vocab_size), so it does not depend on the TP degree it came from.
The split dimension of each name follows the table in `recipes.model.layers`'s docstring.
"""
from __future__ import annotations

import torch

from recipes.checkpoint.format.expert_shards import is_moe_split, merge_moe
from recipes.model.layers import swiglu_fc1_full_order

# name suffix -> TP split dimension (names not listed are replicated over TP ranks)
_SPLIT_DIM = {
    "word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_qkv.bias": 0,
    "mlp.linear_fc1.weight": 0,
    "mlp.linear_fc1.bias": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc2.weight": 1,
    # MLA (recipes.model.mla): the up-projections split by heads; the down-projections and latent norms replicated
    "self_attention.linear_q_proj.weight": 0,
    "self_attention.linear_q_up_proj.weight": 0,
    "self_attention.linear_kv_up_proj.weight": 0,
    "eh_proj.weight": 0,  # model.mtp's depths (recipes.model.mtp)
}
_VOCAB = ("word_embeddings.weight", "output_layer.weight")


def split_dim(name: str) -> int | None:
    for suffix, dim in _SPLIT_DIM.items():
        if name.endswith(suffix):
            return dim
    return None


def is_vocab(name: str) -> bool:
    return name.endswith(_VOCAB)


def _is_swiglu_fc1(name: str, swiglu: bool) -> bool:
    return swiglu and name.endswith(("mlp.linear_fc1.weight", "mlp.linear_fc1.bias"))


def merge_tp(name: str, shards: list[torch.Tensor], swiglu: bool) -> torch.Tensor:
    """Full tensor from its TP shards (rank order); expert tensors of an EP = 1 checkpoint too (their TP split is
    recipes.checkpoint.format.expert_shards's; experts split over EP ranks are joined there)."""
    if is_moe_split(name):
        return merge_moe(name, [shards], swiglu)
    dim = split_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if _is_swiglu_fc1(name, swiglu):
        return swiglu_fc1_full_order(shards)  # each shard is [gate_r; up_r]
    return torch.cat(shards, dim=dim)


def split_tp(name: str, full: torch.Tensor, tp: int, rank: int, swiglu: bool) -> torch.Tensor:
    """This TP rank's shard of a full tensor (the inverse of `merge_tp`)."""
    dim = split_dim(name)
    if dim is None or tp == 1:
        return full
    if _is_swiglu_fc1(name, swiglu):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]], dim=0)
    if full.shape[dim] % tp:
        raise ValueError(f"{name}: dimension {dim} of size {full.shape[dim]} does not split over tp={tp}")
    return full.chunk(tp, dim=dim)[rank]


def strip_vocab(name: str, full: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return full[:vocab_size] if is_vocab(name) else full


def pad_vocab(name: str, full: torch.Tensor, padded_vocab: int) -> torch.Tensor:
    """Zero rows up to the padded vocabulary (padded rows never get a gradient: they are never looked up and their
    logits are masked out of the loss), so zero weights and zero Adam moments are their exact state."""
    if not is_vocab(name) or full.shape[0] == padded_vocab:
        return full
    pad = full.new_zeros((padded_vocab - full.shape[0], *full.shape[1:]))
    return torch.cat([full, pad], dim=0)


def canonical_name(name: str) -> str:
    """DeepSpeed names a tied embedding 'tied_modules.embed.<attr>' in a PipelineModule; layer 0 owns it."""
    for prefix in ("tied_modules.embed.", "module.tied_modules.embed."):
        if name.startswith(prefix):
            return "0." + name[len(prefix):]
    return name[len("module."):] if name.startswith("module.") else name


# Buffers that are model state (trained, not by the optimizer): in the canonical state like weights, replicated over
# TP and EP. model.moe.expert_bias's per-expert routing bias (recipes.model.deepseek_routing), fp32.
STATE_BUFFERS = ("mlp.router.expert_bias",)


def is_state_buffer(name: str) -> bool:
    return name.endswith(STATE_BUFFERS)


def state_buffers(module) -> dict:
    """canonical name -> tensor of the module's state buffers."""
    return {canonical_name(n): b for n, b in module.named_buffers() if is_state_buffer(n)}

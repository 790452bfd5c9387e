"""How the MoE tensors of the canonical full state (recipes.checkpoint.format.shards: pipeline-layer names, full
tensors)
split over TP and EP ranks, and how the parts join again (the table in recipes.model.moe).

Routed experts are stacked [E, ...]: EP rank r holds experts [r n, (r + 1) n) (n = E / ep) on dim 0, then the TP split
of an expert matrix (fc1 rows on dim 1, SwiGLU as [gate_t; up_t] per TP rank like the dense fc1; fc2 columns on dim
2). The shared expert splits like a dense MLP. The router, the shared-expert gate and the qk norms are replicated, as
recipes.checkpoint.format.shards already says of every name it does not list. Names are the same at every layout (the
expert index is a tensor dimension, not part of the name).
"""
from __future__ import annotations

import torch

_EXPERT_FC1, _EXPERT_FC2 = "mlp.experts.linear_fc1.weight", "mlp.experts.linear_fc2.weight"
_SHARED_FC1, _SHARED_FC2 = "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight"


def is_moe_split(name: str) -> bool:
    """Whether `name` splits by the rules here (else recipes.checkpoint.format.shards's rules apply)."""
    return name.endswith((_EXPERT_FC1, _EXPERT_FC2, _SHARED_FC1, _SHARED_FC2))


def tp_dim(name: str) -> int:
    """The dimension an expert tensor splits over TP (the EP split is dim 0 of the routed experts)."""
    if name.endswith(_EXPERT_FC1):
        return 1
    if name.endswith(_EXPERT_FC2):
        return 2
    if name.endswith(_SHARED_FC1):
        return 0
    if name.endswith(_SHARED_FC2):
        return 1
    raise ValueError(f"{name} is not an expert tensor")


def _rows(full: torch.Tensor, dim: int, tp: int, rank: int, swiglu: bool) -> torch.Tensor:
    if not swiglu:
        return full.chunk(tp, dim=dim)[rank]
    gate, up = full.chunk(2, dim=dim)
    return torch.cat([gate.chunk(tp, dim=dim)[rank], up.chunk(tp, dim=dim)[rank]], dim=dim)


def _join_rows(parts: list[torch.Tensor], dim: int, swiglu: bool) -> torch.Tensor:
    if not swiglu:
        return torch.cat(parts, dim=dim)
    gates, ups = zip(*(p.chunk(2, dim=dim) for p in parts))
    return torch.cat(list(gates) + list(ups), dim=dim)


def split_moe(name: str, full: torch.Tensor, tp: int, tp_rank: int, ep: int, ep_rank: int,
              swiglu: bool) -> torch.Tensor:
    """This (TP, EP) rank's part of a full MoE tensor."""
    if name.endswith((_EXPERT_FC1, _EXPERT_FC2)):
        if full.shape[0] % ep:
            raise ValueError(f"{name}: {full.shape[0]} experts do not split over ep={ep}")
        n = full.shape[0] // ep
        full = full[ep_rank * n:(ep_rank + 1) * n]
        return _rows(full, 1, tp, tp_rank, swiglu) if name.endswith(_EXPERT_FC1) else full.chunk(tp, dim=2)[tp_rank]
    if name.endswith(_SHARED_FC1):
        return _rows(full, 0, tp, tp_rank, swiglu)
    if name.endswith(_SHARED_FC2):
        return full.chunk(tp, dim=1)[tp_rank]
    raise ValueError(f"{name} is not an expert tensor")


def merge_moe(name: str, parts: list[list[torch.Tensor]], swiglu: bool) -> torch.Tensor:
    """The full tensor from parts[ep_rank][tp_rank] (the inverse of `split_moe`)."""
    if name.endswith((_EXPERT_FC1, _EXPERT_FC2)):
        dim = 1 if name.endswith(_EXPERT_FC1) else 2
        per_ep = [_join_rows(tp_parts, dim, swiglu and dim == 1) for tp_parts in parts]
        return torch.cat(per_ep, dim=0)
    if name.endswith(_SHARED_FC1):
        return _join_rows(parts[0], 0, swiglu)
    if name.endswith(_SHARED_FC2):
        return torch.cat(parts[0], dim=1)
    raise ValueError(f"{name} is not an expert tensor")

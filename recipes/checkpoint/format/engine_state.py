"""Put a full state (recipes.checkpoint.format.full_state) into a live DeepSpeed engine at any layout: every rank
cuts its TP shard (and for the experts its EP x TP shard, recipes.checkpoint.format.expert_shards) out of the full
tensors and puts weights, fp32 masters and Adam moments where DeepSpeed keeps them, so that the engine's own save then
writes DeepSpeed's files (recipes.train.state_writer runs it). `gather_full_state` is the way back out: a live
engine's parameters (and Adam's moments) as full tensors (recipes.train.state_reader runs it on an engine that loaded
a checkpoint)."""
from __future__ import annotations

import torch

from recipes.checkpoint.format import deepspeed_private
from recipes.checkpoint.format.full_state import OpenFullState
from recipes.checkpoint.format.expert_shards import is_moe_split, merge_moe, split_moe
from recipes.checkpoint.format.shards import (canonical_name, merge_tp, pad_vocab, split_dim, split_tp, state_buffers,
                                              strip_vocab)


def install_full_state(eng, recipe, state: OpenFullState, tp_rank: int, ep_rank: int = 0,
                       schedule: bool = True) -> None:
    """Put this rank's shards of `state` into the engine (`eng`: recipes.train.engine.Engine). `state` reads tensors by
    canonical name (`keys()`, `get_tensor(name)`: safetensors handles, or recipes.checkpoint.init_from's sources);
    `ep_rank`: this rank's expert shard (megatron-core's expert-model-parallel rank) when the model has experts.
    With moments, the saved lr schedule too unless `schedule` is False (a run started from another keeps its own)."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    m = recipe.model
    tp, ep, swiglu = eng.layout.tp, eng.layout.ep, m.activation == "swiglu"
    padded = m.padded_vocab_size(tp)
    zero = deepspeed_private.zero_optimizer(eng.engine.optimizer)
    step = state.meta.get("optimizer_step")

    def local(source, name, like):
        full = pad_vocab(name, source.get_tensor(name).float(), padded)
        if is_moe_split(name):  # experts split over EP and TP
            t = split_moe(name, full, tp, tp_rank, ep, ep_rank, swiglu)
        else:
            t = split_tp(name, full, tp, tp_rank, swiglu)
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(f"{name}: shard {tuple(t.shape)} does not fit the model's {tuple(like.shape)}")
        return t.to(like.device)

    if state.moments is not None and zero is not None:
        _create_moments(zero, step)  # then filled fragment by fragment below
    names = set(state.weights.keys())
    for raw, p in eng.module.named_parameters():
        name = canonical_name(raw)
        if name not in names:
            raise ValueError(f"the full state has no '{name}' (recipe and state do not match)")
        value = local(state.weights, name, p)
        with torch.no_grad():
            p.data.copy_(value.to(p.dtype))
        if zero is not None:
            safe_set_full_fp32_param(p, value)
        if state.moments is None:
            continue
        a, b = (local(src, name, p) for src in state.moments)
        if zero is not None:
            safe_set_full_optimizer_state(p, a, "exp_avg")
            safe_set_full_optimizer_state(p, b, "exp_avg_sq")
        else:  # ZeRO-0: the torch optimizer holds the (TP-local) parameter itself
            eng.optimizer.state[p] = {"step": torch.tensor(float(step or 0)), "exp_avg": a.clone(),
                                      "exp_avg_sq": b.clone()}
    _install_state_buffers(eng, state)
    if state.moments is not None and schedule:
        _restore_schedule(eng, state.meta)


def _install_state_buffers(eng, state: OpenFullState) -> None:
    """The model state that is not a parameter (the routing biases, shards.STATE_BUFFERS): whole on every rank, fp32;
    a state without them (a run that had none) leaves the model's initial values."""
    names = set(state.weights.keys())
    for name, buf in state_buffers(eng.module).items():
        if name in names:
            buf.data = state.weights.get_tensor(name).float().to(buf.device)


def _create_moments(zero, step: float | None) -> None:
    """ZeRO-1/2 create Adam's state lazily at the first step; create it here (zeros, the given step count) and let
    DeepSpeed link each parameter's fragment of it."""
    for flat in zero.single_partition_of_fp32_groups:
        zero.optimizer.state[flat] = {"step": torch.tensor(float(step or 0)),
                                      "exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)}
    deepspeed_private.link_optimizer_state(zero)


def link_loaded_moments(eng) -> None:
    """After `load_checkpoint`: link every parameter's fragment to the loaded Adam state (DeepSpeed links them only
    at the next step), so that `gather_full_state` can read the moments; zeros with step 0 where the checkpoint was
    saved before the first step (an import)."""
    zero = deepspeed_private.zero_optimizer(eng.engine.optimizer)
    if zero is None:
        return
    if not zero.optimizer.state:
        _create_moments(zero, 0.0)
    else:
        deepspeed_private.link_optimizer_state(zero)


def _restore_schedule(eng, meta: dict) -> None:
    # One lr for all groups (recipes.train.engine gives decay / no-decay groups the same schedule); the number of
    # groups per stage depends on the layout (a stage with only matrices has one), so take the first.
    lrs = meta.get("param_group_lrs") or []
    for group in eng.optimizer.param_groups:
        if lrs:
            group["lr"] = lrs[0]
    sched, saved = eng.engine.lr_scheduler, meta.get("lr_scheduler")
    if saved and sched is not None:
        sched.last_epoch = saved["last_epoch"]
        sched._step_count = saved.get("_step_count", saved["last_epoch"] + 1)
        sched._last_lr = [g["lr"] for g in eng.optimizer.param_groups]


# ------------------------------------------------------------------------------------------------- the way back out
def _gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, t.contiguous(), group=group)
    return parts


KINDS = ("weights", "exp_avg", "exp_avg_sq")  # fp32 masters (module weights under ZeRO-0) and Adam's moments


def _local_value(p, kind: str, zero_stage: int) -> torch.Tensor:
    """This rank's `kind` of parameter `p` over its DP group (the expert-data-parallel group for experts): ZeRO's
    partitions gathered by DeepSpeed (a collective)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    if kind == "weights":
        value = safe_get_full_fp32_param(p) if zero_stage >= 1 else None
        return (p.data if value is None else value).float().cpu()
    value = safe_get_full_optimizer_state(p, kind) if zero_stage >= 1 else None
    if value is None:  # no ZeRO-1/2 mapping, or saved before the first step (Adam's state is created lazily)
        raise ValueError(f"no '{kind}' optimizer state for this parameter (reshape with moments needs ZeRO-1/2)")
    return value.float().cpu()


def gather_full_state(eng, recipe, kinds: tuple[str, ...] = ("weights",)) -> dict[str, dict]:
    """Collective over each stage's TP and TP x EP groups: {kind: this stage's parameters as full canonical tensors}
    for each of `kinds` (KINDS), vocabulary unpadded."""
    from megatron.core import parallel_state as ps

    swiglu = recipe.model.activation == "swiglu"
    tp, ep = eng.layout.tp, eng.layout.ep
    out: dict[str, dict] = {k: {} for k in kinds}
    for raw, p in eng.module.named_parameters():
        name = canonical_name(raw)
        for kind in kinds:
            value = _local_value(p, kind, eng.layout.zero_stage)
            if is_moe_split(name) and tp * ep > 1:  # tp_ep group: ranks ordered EP-major, TP-minor
                flat = _gather(value, ps.get_expert_tensor_and_model_parallel_group())
                value = merge_moe(name, [flat[e * tp:(e + 1) * tp] for e in range(ep)], swiglu)
            elif split_dim(name) is not None and tp > 1:
                value = merge_tp(name, _gather(value, ps.get_tensor_model_parallel_group()), swiglu)
            out[kind][name] = strip_vocab(name, value, recipe.model.vocab_size).contiguous()
    if "weights" in out:  # the routing biases (shards.STATE_BUFFERS): the same on every rank
        out["weights"].update({n: b.detach().float().cpu().clone() for n, b in state_buffers(eng.module).items()})
    return out


"""Put a full state (recipes.checkpoint.format.full_state) into a live DeepSpeed engine at any layout: every rank
cuts its TP shard out of the full tensors and puts weights, fp32 masters and Adam moments where DeepSpeed keeps
them, so that the engine's own save then writes DeepSpeed's files (recipes.train.state_writer runs it)."""
from __future__ import annotations

import torch

from recipes.checkpoint.format import deepspeed_private
from recipes.checkpoint.format.full_state import OpenFullState
from recipes.checkpoint.format.shards import canonical_name, pad_vocab, split_tp


def install_full_state(eng, recipe, state: OpenFullState, tp_rank: int) -> None:
    """Put this rank's shards of `state` into the engine (`eng`: recipes.train.engine.Engine)."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    m = recipe.model
    tp, swiglu, padded = eng.layout.tp, m.activation == "swiglu", m.padded_vocab_size(eng.layout.tp)
    zero = deepspeed_private.zero_optimizer(eng.engine.optimizer)
    step = state.meta.get("optimizer_step")

    def local(source, name, like):
        t = split_tp(name, pad_vocab(name, source.get_tensor(name).float(), padded), tp, tp_rank, swiglu)
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(f"{name}: shard {tuple(t.shape)} does not fit the model's {tuple(like.shape)}")
        return t.to(like.device)

    if state.moments is not None and zero is not None:
        # ZeRO-1/2 create Adam's state lazily at the first step; create it here (zeros, the saved step count) and
        # let DeepSpeed link each parameter's fragment of it, then fill the fragments.
        for flat in zero.single_partition_of_fp32_groups:
            zero.optimizer.state[flat] = {"step": torch.tensor(float(step or 0)),
                                          "exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)}
        deepspeed_private.link_optimizer_state(zero)
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
    if state.moments is not None:
        _restore_schedule(eng, state.meta)


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

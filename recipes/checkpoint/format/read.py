"""Read a training checkpoint (DeepSpeed files, recipes.checkpoint.format.layout says where) at any TP x PP x DP
layout and ZeRO stage into the canonical full state: name-keyed full tensors without vocabulary padding (see
`recipes.checkpoint.format.shards`), optionally with the Adam moments, in one process and without torch.distributed.

Weights are read from the fp32 master partitions whenever ZeRO >= 1 (exact fp32 masters also for bf16/fp16 runs),
unflattened with DeepSpeed's own zero_to_fp32 merge (recipes.checkpoint.format.deepspeed_private; the same packing
holds the Adam moments); from the model-states files for ZeRO-0.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from recipes.checkpoint.format import deepspeed_private
from recipes.checkpoint.format.errors import CheckpointError
from recipes.checkpoint.format.layout import (LAYER_FILE, SourceLayout, detect_layout, load, model_states_name,
                                              optim_name, zero3_model_states_name)
from recipes.checkpoint.format.layout_record import check_offline_readable
from recipes.checkpoint.format.shards import canonical_name, is_state_buffer, merge_tp, strip_vocab
from recipes.checkpoint.format.tags import client_state, resolve_tag

log = logging.getLogger(__name__)

__all__ = ["CheckpointError", "FullState", "checkpoint_meta", "read_full_state", "resolve_tag", "detect_layout"]


@dataclass
class FullState:
    """Canonical full state of one checkpoint."""

    weights: "OrderedDict[str, torch.Tensor]"
    exp_avg: "OrderedDict[str, torch.Tensor]" = field(default_factory=OrderedDict)
    exp_avg_sq: "OrderedDict[str, torch.Tensor]" = field(default_factory=OrderedDict)
    meta: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- per-TP-rank tensors
def _local_weights_from_module_files(tag_dir: Path, lay: SourceLayout) -> list[dict]:
    """[tp_rank] -> {canonical name: local shard} from the model-states / layer files (ZeRO 0/1/2)."""
    per_tp: list[dict] = [OrderedDict() for _ in range(lay.tp)]
    if lay.pipeline_files:
        files = sorted((int(m.group(1)), int(m.group(2)), p) for p in tag_dir.iterdir()
                       if (m := LAYER_FILE.match(p.name)))
        for layer, tp, path in files:
            for k, v in load(path).items():
                if torch.is_tensor(v):
                    per_tp[tp][f"{layer}.{k}"] = v
    else:  # model-parallel rank mp = stage x TP + TP rank; a tied head's copy (last stage) follows the first's
        for mp in range(lay.model_parallel):
            module = load(tag_dir / model_states_name(mp))["module"]
            for k, v in module.items():
                if torch.is_tensor(v) and not k.endswith("_extra_state"):
                    per_tp[mp % lay.tp].setdefault(canonical_name(k), v)
    return per_tp


def _local_from_zero(tag_dir: Path, lay: SourceLayout, mp: int, keys: tuple[str, ...]) -> dict[str, dict]:
    """{key: {canonical name: local shard}} for one model-parallel rank from its ZeRO partitions.

    key "fp32" = master weights, "exp_avg" / "exp_avg_sq" = Adam moments (same flat packing as the masters).
    """
    optim = [load(tag_dir / optim_name(tag_dir, d, mp))["optimizer_state_dict"] for d in range(lay.dp)]
    # the flat packing order: param_shapes of the model-states file (ZeRO-3: DP rank 0's)
    first = zero3_model_states_name(0, mp) if lay.zero_stage == 3 else model_states_name(mp)
    param_shapes = load(tag_dir / first)["param_shapes"]
    fp32_key = "fp32_flat_groups" if lay.zero_stage == 3 else "single_partition_of_fp32_groups"
    out: dict[str, dict] = {}
    for key in keys:
        if key == "fp32":
            groups = [o[fp32_key] for o in optim]
        else:
            groups = [_moment_groups(o, key, lay.zero_stage, o[fp32_key]) for o in optim]
        if lay.zero_stage == 3:
            merged = deepspeed_private.zero3_merge(groups, param_shapes)
        else:
            merged = deepspeed_private.zero2_merge(groups, param_shapes, optim[0].get("param_alignment_paddings"))
        out[key] = OrderedDict((canonical_name(k), v.clone()) for k, v in merged.items())
    return out


def _moment_groups(optim_sd: dict, key: str, zero_stage: int, fp32_groups: list) -> list[torch.Tensor]:
    base = optim_sd.get("base_optimizer_state") or optim_sd.get("optimizer_state_dict")
    if isinstance(base, dict) and "state" in base:
        state = base["state"]
        if not state:  # saved before the first optimizer step (e.g. an import): Adam's moments are zero
            return [torch.zeros_like(g) for g in fp32_groups]
        return [state[i][key] for i in sorted(state)]
    if isinstance(base, list):  # older layout: one dict per group
        return [g[key] for g in base]
    raise CheckpointError(f"ZeRO-{zero_stage} optimizer file has no '{key}' states (unexpected DeepSpeed layout)")


def _state_buffers(tag_dir: Path, lay: SourceLayout) -> OrderedDict:
    """The model state that is not a parameter (shards.STATE_BUFFERS: the routing biases), from each stage's model
    states (TP rank 0's; every rank holds the same)."""
    out = OrderedDict()
    if lay.pipeline_files:  # DeepSpeed's pipeline engine's files: from before any model had such buffers
        return out
    for stage in range(lay.pp):
        mp = stage * lay.tp
        name = zero3_model_states_name(0, mp) if lay.zero_stage == 3 else model_states_name(mp)
        for k, v in (load(tag_dir / name).get("module") or {}).items():
            if torch.is_tensor(v) and is_state_buffer(k):
                out.setdefault(canonical_name(k), v.float().clone())
    return out


def _merge(per_tp: list[dict], swiglu: bool, vocab_size: int) -> OrderedDict:
    names = list(per_tp[0])
    for r, d in enumerate(per_tp[1:], 1):
        if list(d) != names:
            raise CheckpointError(f"TP rank {r} holds different parameters than TP rank 0: "
                                  f"{sorted(set(d) ^ set(names))[:5]}")
    names.sort(key=lambda n: (int(n.split(".", 1)[0]), n))  # one order whatever file the tensors came from
    return OrderedDict((n, strip_vocab(n, merge_tp(n, [d[n] for d in per_tp], swiglu).float(), vocab_size))
                       for n in names)


def _per_tp(lay: SourceLayout, pieces: dict[int, dict]) -> list[dict]:
    """Model-parallel ranks (stage * TP + tp) -> one dict per TP rank with all stages' parameters."""
    per_tp: list[dict] = [OrderedDict() for _ in range(lay.tp)]
    for mp in sorted(pieces):
        for name, t in pieces[mp].items():
            # A tied embedding has a copy on the last stage too; the first stage's copy is the one in use.
            per_tp[mp % lay.tp].setdefault(name, t)
    return per_tp


# ------------------------------------------------------------------------------------------------------ public
def read_full_state(ckpt_dir: str | Path, model_cfg, tag: str | None = None, with_moments: bool = False,
) -> FullState:
    """Canonical full state of a checkpoint. `model_cfg` is the recipe's model section (for the vocabulary size and
    the fc1 layout); with_moments also reads Adam's exp_avg / exp_avg_sq (ZeRO >= 1 checkpoints)."""
    tag_dir = resolve_tag(ckpt_dir, tag)
    check_offline_readable(tag_dir)
    lay = detect_layout(tag_dir)
    log.info(f"reading {tag_dir} ({lay.describe()})")
    if with_moments and lay.zero_stage == 0:
        raise CheckpointError(f"{tag_dir}: ZeRO-0 checkpoints keep the optimizer as a torch state dict without "
                              "parameter names; reshape needs ZeRO-1/2/3 (train with parallel.zero_stage >= 1)")
    swiglu, vocab = model_cfg.activation == "swiglu", model_cfg.vocab_size
    state = FullState(weights=OrderedDict())
    # ZeRO >= 1 keeps fp32 master weights in the optimizer partitions: exact even when the run trained in bf16/fp16
    # (the model-states files then hold 16-bit copies). ZeRO-0 has only the model-states files.
    if lay.zero_stage >= 1:
        keys = ("fp32", "exp_avg", "exp_avg_sq") if with_moments else ("fp32",)
        zero = {mp: _local_from_zero(tag_dir, lay, mp, keys) for mp in range(lay.tp * lay.pp)}
        merged = {key: _merge(_per_tp(lay, {mp: z[key] for mp, z in zero.items()}), swiglu, vocab) for key in keys}
        state.weights = merged["fp32"]
        state.weights.update(_state_buffers(tag_dir, lay))  # not in the optimizer: from the module states
        state.exp_avg, state.exp_avg_sq = merged.get("exp_avg", OrderedDict()), merged.get("exp_avg_sq", OrderedDict())
    else:
        state.weights = _merge(_local_weights_from_module_files(tag_dir, lay), swiglu, vocab)
    _check_names(state.weights, model_cfg, tag_dir)
    state.meta = checkpoint_meta(tag_dir, lay, optimizer=with_moments)
    return state


def checkpoint_meta(tag_dir: Path, lay: SourceLayout, optimizer: bool = False) -> dict:
    """What a tag records besides its tensors: client state, lr schedule, step counters; with `optimizer` also the
    optimizer's step count and lrs (what a re-layout with moments carries)."""
    meta = _meta(tag_dir, lay)
    if optimizer:
        meta.update(_optimizer_meta(tag_dir))
    return meta


def _meta(tag_dir: Path, lay: SourceLayout) -> dict:
    first = load(tag_dir / (model_states_name(0) if lay.zero_stage < 3 else zero3_model_states_name(0, 0)))
    return {
        "tag": tag_dir.name,
        "source_layout": lay.__dict__,
        "client_state": client_state(tag_dir),
        "lr_scheduler": first.get("lr_scheduler"),
        "global_steps": first.get("global_steps"),
        "global_samples": first.get("global_samples"),
        "skipped_steps": first.get("skipped_steps", 0),
    }


def _optimizer_meta(tag_dir: Path) -> dict:
    """The optimizer's step count and the lr of each param group (DP rank 0, model-parallel rank 0)."""
    o = load(tag_dir / optim_name(tag_dir, 0, 0))["optimizer_state_dict"]
    base = o.get("base_optimizer_state") or o.get("optimizer_state_dict") or {}  # ZeRO-1/2 | ZeRO-3
    groups = base.get("param_groups", []) if isinstance(base, dict) else []
    steps = [float(s["step"]) for s in (base.get("state", {}) if isinstance(base, dict) else {}).values()
             if "step" in s]
    return {"optimizer_step": max(steps) if steps else None, "param_group_lrs": [g["lr"] for g in groups]}


def _check_names(weights: dict, model_cfg, tag_dir: Path) -> None:
    """The checkpoint must hold the parameters of the recipe's model (wrong --config gives a clear error)."""
    L = model_cfg.num_layers
    expected_layers = set(range(0, L + 3 + model_cfg.mtp_depths)) - ({L + 2} if model_cfg.tied_embeddings else set())
    got_layers = {int(n.split(".", 1)[0]) for n in weights}
    emb = weights.get("0.word_embeddings.weight")
    if got_layers != expected_layers or emb is None or emb.shape[1] != model_cfg.hidden_size:
        raise CheckpointError(
            f"{tag_dir} does not match the recipe's model (num_layers={L}, hidden_size={model_cfg.hidden_size}, "
            f"tied_embeddings={model_cfg.tied_embeddings}): it holds pipeline layers {sorted(got_layers)}"
            f"{'' if emb is None else f' and an embedding of shape {tuple(emb.shape)}'}; pass the recipe the "
            "checkpoint was trained with (--config and the same overrides)")

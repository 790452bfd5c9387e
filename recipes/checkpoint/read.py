"""Read a training checkpoint (DeepSpeed files written by `recipes.checkpoint.store.save`) at any TP x PP x DP layout and
ZeRO stage into the canonical full state: name-keyed full tensors without vocabulary padding (see
`recipes.checkpoint.shards`), optionally with the Adam moments, in one process and without torch.distributed.

Where the tensors live in DeepSpeed's files:
  * PP > 1 (pipeline engine, ZeRO 0/1): `layer_XX-model_TT-model_states.pt` per pipeline layer and TP rank.
  * PP = 1, ZeRO 0/1/2: `mp_rank_TT_model_states.pt` ['module'].
  * ZeRO-3: weights only in the fp32 partitions of `zero_pp_rank_D_mp_rank_TT_optim_states.pt`.
  * ZeRO >= 1: fp32 master weights and Adam moments as flat per-DP-rank partitions in the optim files, unflattened
    with DeepSpeed's own zero_to_fp32 merge (same packing for the moments as for the masters). Weights are read
    from here whenever ZeRO >= 1 (exact fp32 masters also for bf16/fp16 runs); from the model-states files for ZeRO-0.
The model-parallel rank of a file is `stage * TP + tp_rank` (DeepSpeed's grid, TP fastest).
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import re
from types import SimpleNamespace
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from recipes.checkpoint import safe_load, store as ckpt
from recipes.checkpoint.shards import canonical_name, merge_tp, strip_vocab

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, with what to do about it."""


_LAYER_FILE = re.compile(r"^layer_(\d+)-model_(\d+)-model_states\.pt$")
_OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MP_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_Z3_MODEL_FILE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")


def resolve_tag(ckpt_dir: str | Path, tag: str | None = None) -> Path:
    """The tag directory to read: --tag, else DeepSpeed's `latest` pointer; checked complete (complete.json sizes)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise CheckpointError(f"{root}: no such checkpoint directory")
    if tag is None:
        latest = root / "latest"
        if not latest.is_file():
            found = [t for _, t in ckpt._tags(root)]
            newest = ckpt.newest_complete(str(root))
            if newest:
                hint = f"; tags found: {', '.join(found)}; pass --tag {newest} (the newest complete one)"
            elif found:
                hint = f"; tags found: {', '.join(found)}, none complete (no complete.json): the saves were interrupted"
            else:
                hint = "; no global_step* tags either: is this a training checkpoint directory (checkpoint.dir)?"
            raise CheckpointError(f"{root}: no `latest` file naming the checkpoint tag{hint}")
        tag = latest.read_text().strip()
    tag_dir = root / tag
    if not tag_dir.is_dir():
        raise CheckpointError(f"{tag_dir}: tag directory missing (named by {root / 'latest'} or --tag)")
    bad = ckpt.problems(tag_dir)
    if bad:
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        raise CheckpointError(f"{tag_dir} is incomplete or damaged: {'; '.join(bad[:3])}{more}; "
                              "use an older tag with --tag or re-save it")
    return tag_dir


def _load(path: Path) -> dict:
    try:
        return safe_load.load(path)
    except safe_load.UnsafeCheckpointError as e:
        raise CheckpointError(str(e)) from None
    except Exception as e:  # truncated / corrupt files raise many different errors
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e}); the file is damaged, use another "
                              "tag with --tag") from e


@dataclass
class SourceLayout:
    tp: int
    pp: int
    dp: int
    zero_stage: int
    pipeline_files: bool  # per-layer files (PipelineModule)

    def describe(self) -> str:
        return f"TP={self.tp} x PP={self.pp} x DP={self.dp}, ZeRO-{self.zero_stage}"


@dataclass
class FullState:
    """Canonical full state of one checkpoint."""

    weights: "OrderedDict[str, torch.Tensor]"
    exp_avg: "OrderedDict[str, torch.Tensor]" = field(default_factory=OrderedDict)
    exp_avg_sq: "OrderedDict[str, torch.Tensor]" = field(default_factory=OrderedDict)
    meta: dict = field(default_factory=dict)


def detect_layout(tag_dir: Path) -> SourceLayout:
    names = [p.name for p in tag_dir.iterdir()]
    layer_tp = {int(m.group(2)) for n in names if (m := _LAYER_FILE.match(n))}
    optim = [(int(m.group(1)), int(m.group(2))) for n in names if (m := _OPTIM_FILE.match(n))]
    mp_files = sorted(int(m.group(1)) for n in names if (m := _MP_FILE.match(n)))
    z3_files = [(int(m.group(1)), int(m.group(2))) for n in names if (m := _Z3_MODEL_FILE.match(n))]
    if z3_files:
        tp = 1 + max(mp for _, mp in z3_files)
        dp = 1 + max(d for d, _ in z3_files)
        return SourceLayout(tp=tp, pp=1, dp=dp, zero_stage=3, pipeline_files=False)
    if not mp_files:
        raise CheckpointError(f"{tag_dir}: no DeepSpeed model-states files (mp_rank_*_model_states.pt); not a "
                              "DeepSpeed training checkpoint")
    first = _load(tag_dir / "mp_rank_00_model_states.pt")
    zero_stage = 0
    if optim:
        o = _load(tag_dir / _optim_name(tag_dir, 0, 0))["optimizer_state_dict"]
        zero_stage = int(o.get("zero_stage", 1))
    dp = int(first.get("dp_world_size", 1 + max((d for d, _ in optim), default=0)))
    if layer_tp:
        dims = first.get("checkpoint_parallel_dimensions") or {}
        tp = int(dims.get("tp_degree", len(layer_tp)))
        pp = int(dims.get("pp_degree", len(mp_files) // tp))
        return SourceLayout(tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, pipeline_files=True)
    return SourceLayout(tp=len(mp_files), pp=1, dp=dp, zero_stage=zero_stage, pipeline_files=False)


def _optim_name(tag_dir: Path, dp: int, mp: int) -> str:
    for prefix in ("", "bf16_"):
        name = f"{prefix}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt"
        if (tag_dir / name).is_file():
            return name
    raise CheckpointError(f"{tag_dir}: optimizer partition of DP rank {dp}, model-parallel rank {mp} is missing")


# ------------------------------------------------------------------------------------------- per-TP-rank tensors
def _local_weights_from_module_files(tag_dir: Path, lay: SourceLayout) -> list[dict]:
    """[tp_rank] -> {canonical name: local shard} from the model-states / layer files (ZeRO 0/1/2)."""
    per_tp: list[dict] = [OrderedDict() for _ in range(lay.tp)]
    if lay.pipeline_files:
        files = sorted((int(m.group(1)), int(m.group(2)), p) for p in tag_dir.iterdir()
                       if (m := _LAYER_FILE.match(p.name)))
        for layer, tp, path in files:
            for k, v in _load(path).items():
                if torch.is_tensor(v):
                    per_tp[tp][f"{layer}.{k}"] = v
    else:
        for tp in range(lay.tp):
            module = _load(tag_dir / f"mp_rank_{tp:02d}_model_states.pt")["module"]
            for k, v in module.items():
                if torch.is_tensor(v) and not k.endswith("_extra_state"):
                    per_tp[tp][canonical_name(k)] = v
    return per_tp


def _silently(fn, *args):
    # zero_to_fp32 prints (stdout) and shows tqdm bars (stderr) of its own
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args)


def _local_from_zero(tag_dir: Path, lay: SourceLayout, mp: int, keys: tuple[str, ...]) -> dict[str, dict]:
    """{key: {canonical name: local shard}} for one model-parallel rank from its ZeRO partitions.

    key "fp32" = master weights, "exp_avg" / "exp_avg_sq" = Adam moments (same flat packing as the masters).
    """
    from deepspeed.utils import zero_to_fp32 as z

    optim = [_load(tag_dir / _optim_name(tag_dir, d, mp))["optimizer_state_dict"] for d in range(lay.dp)]
    if lay.zero_stage == 3:
        model_files = [tag_dir / f"zero_pp_rank_{d}_mp_rank_{mp:02d}_model_states.pt" for d in range(lay.dp)]
    else:
        model_files = [tag_dir / f"mp_rank_{mp:02d}_model_states.pt"]
    # zero_to_fp32's merges read only `param_shapes` (the flat packing order) of the model-states files
    model_states = [SimpleNamespace(param_shapes=_load(f)["param_shapes"]) for f in model_files]
    out: dict[str, dict] = {}
    for key in keys:
        if key == "fp32":
            groups = [o["fp32_flat_groups" if lay.zero_stage == 3 else "single_partition_of_fp32_groups"]
                      for o in optim]
        else:
            fp32_key = "fp32_flat_groups" if lay.zero_stage == 3 else "single_partition_of_fp32_groups"
            groups = [_moment_groups(o, key, lay.zero_stage, o[fp32_key]) for o in optim]
        merged: OrderedDict = OrderedDict()
        if lay.zero_stage == 3:
            _silently(z._zero3_merge_trainable_params, merged, lay.dp, groups, model_states)
            merged = OrderedDict((k, v.contiguous()) for k, v in merged.items())
        else:
            _silently(z._zero2_merge_trainable_params, merged, lay.dp, groups, model_states,
                      optim[0].get("param_alignment_paddings"))
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
    lay = detect_layout(tag_dir)
    log.info(f"reading {tag_dir} ({lay.describe()})")
    swiglu = model_cfg.activation == "swiglu"
    mp_ranks = range(lay.tp * lay.pp)
    keys = ("fp32", "exp_avg", "exp_avg_sq") if with_moments else ("fp32",)
    if with_moments and lay.zero_stage == 0:
        raise CheckpointError(f"{tag_dir}: ZeRO-0 checkpoints keep the optimizer as a torch state dict without "
                              "parameter names; reshape needs ZeRO-1/2/3 (train with parallel.zero_stage >= 1)")
    state = FullState(weights=OrderedDict())
    # ZeRO >= 1 keeps fp32 master weights in the optimizer partitions: exact even when the run trained in bf16/fp16
    # (the model-states files then hold 16-bit copies). ZeRO-0 has only the model-states files.
    if lay.zero_stage >= 1:
        zero = {mp: _local_from_zero(tag_dir, lay, mp, keys) for mp in mp_ranks}
        state.weights = _merge(_per_tp(lay, {mp: z["fp32"] for mp, z in zero.items()}), swiglu, model_cfg.vocab_size)
        if with_moments:
            state.exp_avg = _merge(_per_tp(lay, {mp: z["exp_avg"] for mp, z in zero.items()}), swiglu,
                                   model_cfg.vocab_size)
            state.exp_avg_sq = _merge(_per_tp(lay, {mp: z["exp_avg_sq"] for mp, z in zero.items()}), swiglu,
                                      model_cfg.vocab_size)
    else:
        state.weights = _merge(_local_weights_from_module_files(tag_dir, lay), swiglu, model_cfg.vocab_size)
    _check_names(state.weights, model_cfg, tag_dir)
    first = _load(tag_dir / ("mp_rank_00_model_states.pt" if lay.zero_stage < 3
                             else "zero_pp_rank_0_mp_rank_00_model_states.pt"))
    marker = json.loads((tag_dir / ckpt.MARKER).read_text())
    state.meta = {
        "tag": tag_dir.name,
        "source_layout": lay.__dict__,
        "client_state": marker.get("client_state", {}),
        "lr_scheduler": first.get("lr_scheduler"),
        "global_steps": first.get("global_steps"),
        "global_samples": first.get("global_samples"),
        "skipped_steps": first.get("skipped_steps", 0),
    }
    if with_moments:
        o = _load(tag_dir / _optim_name(tag_dir, 0, 0))["optimizer_state_dict"]
        base = o.get("base_optimizer_state") or o.get("optimizer_state_dict") or {}  # ZeRO-1/2 | ZeRO-3
        groups = base.get("param_groups", []) if isinstance(base, dict) else []
        steps = [float(s["step"]) for s in (base.get("state", {}) if isinstance(base, dict) else {}).values()
                 if "step" in s]
        state.meta["optimizer_step"] = max(steps) if steps else None
        state.meta["param_group_lrs"] = [g["lr"] for g in groups]
    return state


def _check_names(weights: dict, model_cfg, tag_dir: Path) -> None:
    """The checkpoint must hold the parameters of the recipe's model (wrong --config gives a clear error)."""
    L = model_cfg.num_layers
    expected_layers = set(range(0, L + 3 - (1 if model_cfg.tied_embeddings else 0)))
    got_layers = {int(n.split(".", 1)[0]) for n in weights}
    emb = weights.get("0.word_embeddings.weight")
    if got_layers != expected_layers or emb is None or emb.shape[1] != model_cfg.hidden_size:
        raise CheckpointError(
            f"{tag_dir} does not match the recipe's model (num_layers={L}, hidden_size={model_cfg.hidden_size}, "
            f"tied_embeddings={model_cfg.tied_embeddings}): it holds pipeline layers {sorted(got_layers)}"
            f"{'' if emb is None else f' and an embedding of shape {tuple(emb.shape)}'}; pass the recipe the "
            "checkpoint was trained with (--config and the same overrides)")

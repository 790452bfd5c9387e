"""Re-lay a ZeRO-1/2 training checkpoint to any TP x PP x DP in one process, one tensor at a time.

No engine and no process per target rank: the target's DeepSpeed files are computed, not saved by ranks. For each
target stage and TP rank, the writer lays out the optimizer's flat param groups exactly as DeepSpeed's ZeRO-1/2
optimizer does at construction (deepspeed/runtime/zero/stage_1_and_2.py: parameters in `model.parameters()` order,
decay group then no-decay group, no per-parameter alignment, the flat group padded to a multiple of
2 x DP and cut into DP equal partitions), then fills each DP rank's partition of fp32 masters and Adam moments tensor
by tensor: a tensor is read from the source (memory-mapped files, only the source DP partitions that hold it, merged
over the source TP ranks: recipes.checkpoint.shards), re-padded and cut for the target TP rank, copied in and released.
`engine.load_checkpoint` at the target layout then loads these files as its own (same keys, same flat layout).

Memory: one full tensor (x3: master, exp_avg, exp_avg_sq) plus the target's own per-rank pieces: one DP rank's
optimizer partition (x3) while its file is built, and one layer's TP shards for the per-layer weight files. PP = 1
targets keep DeepSpeed's single module file per TP rank (the whole TP shard of the model): that is the format, not
this writer. Files are read with recipes.checkpoint.safe_load (weights_only + allow-list, memory-mapped).

Supported: sources ZeRO-1/2 (any TP x PP x DP), targets ZeRO-1/2, untied embeddings; the rest goes through the
engine writer (recipes.train.state_writer; `python -m recipes reshape` picks).
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from recipes.checkpoint import safe_load, store
from recipes.checkpoint.read import CheckpointError, SourceLayout, _optim_name, detect_layout
from recipes.checkpoint.recipe_file import write_recipe
from recipes.checkpoint.shards import is_vocab, merge_tp, pad_vocab, split_dim, split_tp, strip_vocab

log = logging.getLogger(__name__)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_KINDS = ("fp32", "exp_avg", "exp_avg_sq")


def unsupported(source: SourceLayout, recipe, target_zero: int) -> str | None:
    """Why the streaming writer cannot do this re-layout (None: it can)."""
    if source.zero_stage not in (1, 2):
        return f"the source is ZeRO-{source.zero_stage} (streaming reads ZeRO-1/2 partitions)"
    if target_zero not in (1, 2):
        return f"the target is ZeRO-{target_zero} (streaming writes ZeRO-1/2)"
    if recipe.model.tied_embeddings:
        return "tied embeddings (a pipeline keeps a second copy on the last stage)"
    return None


# ------------------------------------------------------------------------------------------------------- source
class Source:
    """Full canonical tensors of a ZeRO-1/2 checkpoint, read slice by slice from memory-mapped files."""

    def __init__(self, tag_dir: Path, model_cfg):
        self.dir, self.cfg = tag_dir, model_cfg
        self.lay = detect_layout(tag_dir)
        self.swiglu = model_cfg.activation == "swiglu"
        self._files: dict[str, dict] = {}
        lay = self.lay
        # name -> (stage, group, offset in the flat group, local shape); groups are laid out alike on every TP rank
        self.index: dict[str, tuple] = {}
        self.order: list[str] = []  # model.parameters() order over all stages
        self.part: dict[tuple[int, int], int] = {}  # (stage, group) -> DP partition size
        first = self.load(f"mp_rank_{0:02d}_model_states.pt")
        self.model_states = {k: v for k, v in first.items() if k not in ("module", "param_shapes")}
        self.module_keys = self._module_keys(first)
        for stage in range(lay.pp):
            shapes = self.load(f"mp_rank_{stage * lay.tp:02d}_model_states.pt")["param_shapes"]
            stage_names = []
            for g, od in enumerate(shapes):
                off = 0
                for name, shape in od.items():
                    self.index[name] = (stage, g, off, tuple(shape))
                    stage_names.append(name)
                    off += math.prod(shape)
                align = 2 * lay.dp  # DeepSpeed's nccl_start_alignment_factor x DP
                self.part[(stage, g)] = math.ceil(off / align) * align // lay.dp
            self.order += sorted(stage_names, key=_layer_rank(self.module_keys))
        optim = self.load(_optim_name(tag_dir, 0, 0))["optimizer_state_dict"]
        if any(any(p) for p in optim.get("param_alignment_paddings", [])):
            raise CheckpointError(f"{tag_dir}: saved with zero_optimization.parameter_alignment; the streaming "
                                  "re-layout expects DeepSpeed's default (no per-parameter alignment)")
        base = optim["base_optimizer_state"]
        self.optim_globals = {k: optim[k] for k in ("loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad")}
        self.param_group = {k: v for k, v in base["param_groups"][0].items() if k != "params"}
        steps = [s["step"] for s in base.get("state", {}).values() if "step" in s]
        self.step = steps[0].clone() if steps else None
        self.release()

    def load(self, name: str) -> dict:
        if name not in self._files:
            try:
                self._files[name] = safe_load.load(self.dir / name, mmap=True)
            except safe_load.UnsafeCheckpointError as e:
                raise CheckpointError(str(e)) from None
        return self._files[name]

    def release(self) -> None:
        """Drop the open (memory-mapped) files: their touched pages go with them."""
        self._files.clear()

    def _module_keys(self, first: dict) -> dict[int, list[str]]:
        """layer -> its state-dict keys in order (parameters and the `_extra_state` entries DeepSpeed keeps)."""
        keys: dict[int, list[str]] = {}
        if self.lay.pipeline_files:
            for p in sorted(self.dir.glob("layer_*-model_00-model_states.pt")):
                layer = int(p.name.split("-", 1)[0][len("layer_"):])
                keys[layer] = [f"{layer}.{k}" for k in safe_load.load(p, mmap=True)]
        else:
            for k in first["module"]:
                keys.setdefault(int(k.split(".", 1)[0]), []).append(k)
        return keys

    def _partition(self, d: int, mp: int, g: int, kind: str) -> torch.Tensor:
        o = self.load(_optim_name(self.dir, d, mp))["optimizer_state_dict"]
        if kind == "fp32":
            return o["single_partition_of_fp32_groups"][g]
        state = o["base_optimizer_state"]["state"]
        if not state:  # saved before the first optimizer step: Adam's moments are zero
            return torch.zeros(self.part[(mp // self.lay.tp, g)])
        return state[g][kind]

    def _local(self, mp: int, name: str, kind: str) -> torch.Tensor:
        stage, g, off, shape = self.index[name]
        P, end, pieces = self.part[(stage, g)], off + math.prod(shape), []
        pos = off
        while pos < end:
            d = pos // P
            hi = min(end, (d + 1) * P)
            pieces.append(self._partition(d, mp, g, kind)[pos - d * P:hi - d * P])
            pos = hi
        return torch.cat(pieces).view(shape)

    def full(self, name: str, kind: str) -> torch.Tensor:
        """Canonical full tensor (all source TP shards merged, vocabulary padding removed), fp32."""
        stage, tp = self.index[name][0], self.lay.tp
        shards = [self._local(stage * tp + t, name, kind) for t in range(tp)]
        return strip_vocab(name, merge_tp(name, shards, self.swiglu).float(), self.cfg.vocab_size).clone()

    def full_shape(self, name: str) -> list[int]:
        shape = list(self.index[name][3])
        dim = split_dim(name)
        if dim is not None:
            shape[dim] *= self.lay.tp
        if is_vocab(name):
            shape[0] = self.cfg.vocab_size
        return shape


def _layer_rank(module_keys: dict[int, list[str]]):
    pos = {k: i for keys in module_keys.values() for i, k in enumerate(keys)}
    return lambda name: (int(name.split(".", 1)[0]), pos.get(name, 0))


# ------------------------------------------------------------------------------------------------------- target
@dataclass
class Group:
    decay: bool
    names: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    shapes: list[tuple] = field(default_factory=list)
    numel: int = 0

    def partition(self, dp: int) -> int:
        align = 2 * dp
        return math.ceil(self.numel / align) * align // dp


class _OneTensorCache:
    """The last full tensors read: a parameter cut by a DP partition boundary is read once for both partitions."""

    def __init__(self, source: Source):
        self.source, self.name, self.values = source, None, None

    def get(self, name: str, kinds: tuple[str, ...] = _KINDS) -> dict:
        if name != self.name:
            self.name, self.values = name, {}  # release before reading the next one
        for k in kinds:
            if k not in self.values:
                self.values[k] = self.source.full(name, k)
        self.source.release()
        return {k: self.values[k] for k in kinds}


def _local_shape(name: str, full: list[int], tp: int, padded_vocab: int) -> tuple:
    shape = list(full)
    if is_vocab(name):
        shape[0] = padded_vocab
    dim = split_dim(name)
    if dim is not None:
        if shape[dim] % tp:
            raise CheckpointError(f"{name}: dimension {dim} of size {shape[dim]} does not split over tp={tp}")
        shape[dim] //= tp
    return tuple(shape)


def relayout(tag_dir: Path, out: Path, recipe, layout, quiet: bool = False) -> dict:
    """Write the checkpoint at `tag_dir` into `out` (a checkpoint.dir) at `layout` for `recipe` (the target recipe).
    Returns figures: seconds, bytes written, files."""
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from recipes.parallel.ds_config import build_ds_config
    from recipes.parallel.partition import stage_boundaries

    t0 = time.time()
    cfg = recipe.model
    src = Source(tag_dir, cfg)
    tp, pp, dp, zero = layout.tp, layout.pp, layout.dp, layout.zero_stage
    padded = cfg.padded_vocab_size(tp)
    swiglu = cfg.activation == "swiglu"
    dtype = _DTYPES[recipe.training.precision]
    marker = json.loads((tag_dir / store.MARKER).read_text())
    client_state = marker.get("client_state", {})
    step = int(client_state.get("step", 0))
    tag = store.tag_for(step)
    out_tag = out / tag
    out_tag.mkdir(parents=True, exist_ok=True)
    parts = stage_boundaries(cfg, tp, pp, recipe.parallel.pipeline_partition) if pp > 1 else [0, 1 << 30]
    opt = recipe.training.optimizer
    wd = opt.weight_decay if opt.type == "adamw" else 0.0
    ds_config = build_ds_config(recipe, layout)
    version = src.model_states.get("ds_version")
    cache = _OneTensorCache(src)
    written = 0
    n_files = 0

    def save(obj, name):
        nonlocal written, n_files
        torch.save(obj, out_tag / name)
        written += (out_tag / name).stat().st_size
        n_files += 1

    for stage in range(pp):
        layers = [L for L in sorted(src.module_keys) if parts[stage] <= L < parts[stage + 1]]
        names = [n for n in src.order if int(n.split(".", 1)[0]) in layers]
        groups = [Group(decay=True), Group(decay=False)]
        for n in names:
            shape = _local_shape(n, src.full_shape(n), tp, padded)
            grp = groups[0 if len(shape) >= 2 else 1]
            grp.names.append(n)
            grp.offsets.append(grp.numel)
            grp.shapes.append(shape)
            grp.numel += math.prod(shape)
        groups = [g for g in groups if g.names]  # DeepSpeed drops an empty param group

        # 1. weights: one file per layer and TP rank (pipeline), or one module per TP rank (PP = 1)
        modules = [OrderedDict() for _ in range(tp)]
        for L in layers:
            per_tp = [OrderedDict() for _ in range(tp)]
            for key in src.module_keys[L]:
                for t in range(tp):
                    per_tp[t][key] = None  # `_extra_state` entries (and the parameters, filled below)
                if key in src.index:
                    full = pad_vocab(key, cache.get(key, ("fp32",))["fp32"], padded)
                    for t in range(tp):
                        per_tp[t][key] = split_tp(key, full, tp, t, swiglu).to(dtype).clone()
            for t in range(tp):
                if pp > 1:
                    save(OrderedDict((k.split(".", 1)[1], v) for k, v in per_tp[t].items()),
                         f"layer_{L:02d}-model_{t:02d}-model_states.pt")
                else:
                    modules[t].update(per_tp[t])
            del per_tp

        # 2. per model-parallel rank: the model-states file (DP rank 0's) and one optimizer file per DP rank
        for t in range(tp):
            mp = stage * tp + t
            lr_sched = dict(src.model_states.get("lr_scheduler") or {})
            for key in ("base_lrs", "_last_lr", "lr_lambdas"):
                if key in lr_sched:
                    lr_sched[key] = [lr_sched[key][0]] * len(groups)
            model_states = dict(src.model_states)
            model_states.update(
                module=modules[t] if pp == 1 else None, optimizer=None, lr_scheduler=lr_sched,
                param_shapes=[OrderedDict((n, torch.Size(s)) for n, s in zip(g.names, g.shapes)) for g in groups],
                dp_world_size=dp, mp_world_size=tp * pp, ds_config=ds_config,
                checkpoint_parallel_dimensions={"pp_degree": pp, "tp_degree": tp})
            model_states.update(client_state)
            save(model_states, f"mp_rank_{mp:02d}_model_states.pt")
            modules[t] = None
            for d in range(dp):
                save(_optim_file(cache, groups, t, d, tp, dp, padded, swiglu, src, wd, zero, version, ds_config,
                                 ZeroStageEnum, fragment_address), f"zero_pp_rank_{d}_mp_rank_{mp:02d}_optim_states.pt")
        if not quiet:
            log.info(f"relayout: stage {stage + 1}/{pp} written ({n_files} files, {written / 2**20:.1f} MiB, "
                     f"{time.time() - t0:.1f} s)")
    write_recipe(recipe, out)
    store.mark_complete(out, tag, step, client_state, recipe.checkpoint.keep_last)
    return {"seconds": time.time() - t0, "bytes": written, "files": n_files}


def _optim_file(cache, groups, t, d, tp, dp, padded, swiglu, src, wd, zero, version, ds_config, ZeroStageEnum,
                fragment_address) -> dict:
    """DP rank d's ZeRO optimizer file of TP rank t, as DeepSpeed's `state_dict()` writes it (rigid checkpoint)."""
    masters, state, paddings, mappings, param_groups = [], {}, [], [], []
    for gi, g in enumerate(groups):
        P = g.partition(dp)
        lo, hi = d * P, (d + 1) * P
        flat = {k: torch.zeros(P) for k in _KINDS}
        mapping = OrderedDict()
        for name, off, shape in zip(g.names, g.offsets, g.shapes):
            end = off + math.prod(shape)
            if end <= lo or off >= hi:
                continue
            a, b = max(off, lo), min(end, hi)
            for k, full in cache.get(name).items():
                local = split_tp(name, pad_vocab(name, full, padded), tp, t, swiglu).reshape(-1)
                flat[k][a - lo:b - lo] = local[a - off:b - off]
            mapping[name] = fragment_address(numel=b - a, start=a - lo)
        pad = P if g.numel <= lo else (hi - g.numel if g.numel < hi else 0)
        masters.append(flat["fp32"][:P - pad].clone())
        entry = {"exp_avg": flat["exp_avg"], "exp_avg_sq": flat["exp_avg_sq"]}
        if src.step is not None:
            entry = {"step": src.step.clone(), **entry}
        state[gi] = entry
        paddings.append(pad)
        mappings.append(mapping)
        param_groups.append({**src.param_group, "weight_decay": wd if g.decay else 0.0, "params": [gi]})
    base = {"state": state if src.step is not None else {}, "param_groups": param_groups}
    return {"optimizer_state_dict": {
        **src.optim_globals, "base_optimizer_state": base, "single_partition_of_fp32_groups": masters,
        "zero_stage": ZeroStageEnum.gradients if zero == 2 else ZeroStageEnum.optimizer_states,
        "group_paddings": paddings, "param_alignment_paddings": [[0] * len(g.names) for g in groups],
        "partition_count": [dp] * len(groups), "ds_version": version, "param_slice_mappings": mappings},
        "ds_config": ds_config, "ds_version": version}

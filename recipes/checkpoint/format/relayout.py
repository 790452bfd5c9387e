"""Re-lay a ZeRO-1/2 training checkpoint to any TP x PP x DP without an engine, one tensor at a time.

No engine and no process per target rank: the target's DeepSpeed files are computed, not saved by ranks. For each
target stage and TP rank, the writer lays out the optimizer's flat param groups exactly as DeepSpeed's ZeRO-1/2
optimizer does at construction (deepspeed/runtime/zero/stage_1_and_2.py: parameters in `model.parameters()` order,
decay group then no-decay group, no per-parameter alignment, the flat group padded to a multiple of
2 x DP and cut into DP equal partitions), then fills each DP rank's partition of fp32 masters and Adam moments tensor
by tensor: a tensor is read from the source (memory-mapped files, only the source DP partitions that hold it, merged
over the source TP ranks: recipes.checkpoint.format.shards), re-padded and cut for the target TP rank, copied in and
released.
`engine.load_checkpoint` at the target layout then loads these files as its own (same keys, same flat layout).

Tied embeddings: a pipeline keeps the word embedding on its first stage and a copy (its head) on the last, each in
that stage's flat groups; both are written from the one canonical tensor (see `_stage_params`). Sources written by
DeepSpeed's pipeline engine (per-layer files, `tied_modules.embed`) are read; targets are always format 2
(recipes.checkpoint.format.layout_record).

Work items are the target's (stage, TP rank) pairs; a pool of worker processes writes them side by side (`workers`).
Memory per worker: one full tensor (x3: master, exp_avg, exp_avg_sq) plus its item's own pieces: one DP rank's
optimizer partition (x3) while its file is built, and one layer's TP shard for the per-layer weight files. PP = 1
targets keep DeepSpeed's single module file per TP rank (the whole TP shard of the model): that is the format, not
this writer. Files are read with recipes.checkpoint.safe_load (weights_only + allow-list, memory-mapped).

Supported: sources ZeRO-1/2 (any TP x PP x DP) of dense models, targets ZeRO-1/2; the rest (mixture-of-experts
models included: their experts sit in DeepSpeed's MoE param groups, partitioned over the expert-data-parallel group)
goes through the engine writer (recipes.train.state_writer; `python -m recipes reshape` picks).
"""
from __future__ import annotations

import logging
import math
import multiprocessing
import os
import resource
import time
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import torch

from data_prep.io import fsync_dir
from recipes.checkpoint import safe_load
from recipes.checkpoint.format import checksums, deepspeed_private, layout_record
from recipes.checkpoint.format.errors import CheckpointError
from recipes.checkpoint.format.expert_shards import is_moe_split, merge_moe, tp_dim as expert_tp_dim
from recipes.checkpoint.format.layout import (SourceLayout, detect_layout, model_states_name,
                                              optim_file_name, optim_name)
from recipes.checkpoint.format.shards import (canonical_name, is_state_buffer, is_vocab, merge_tp, pad_vocab,
                                              split_dim, split_tp, strip_vocab)
from recipes.checkpoint.format.tags import client_state as marked_client_state, mark_complete, tag_for
from recipes.checkpoint.recipe_file import write_recipe
from recipes.checkpoint.writer import write_durably

log = logging.getLogger(__name__)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_KINDS = ("fp32", "exp_avg", "exp_avg_sq")


def unsupported(source: SourceLayout, recipe, target_zero: int) -> str | None:
    """Why the streaming writer cannot do this re-layout (None: it can)."""
    if recipe.model.moe is not None:
        return ("the model has experts (the streaming writer does not lay out DeepSpeed's expert-data-parallel "
                "param groups)")
    if source.zero_stage not in (1, 2):
        return f"the source is ZeRO-{source.zero_stage} (streaming reads ZeRO-1/2 partitions)"
    if target_zero not in (1, 2):
        return f"the target is ZeRO-{target_zero} (streaming writes ZeRO-1/2)"
    return None


# ------------------------------------------------------------------------------------------------------- source
class Source:
    """Full canonical tensors of a ZeRO-1/2 checkpoint, read slice by slice from memory-mapped files."""

    def __init__(self, tag_dir: Path, model_cfg):
        self.dir, self.cfg = tag_dir, model_cfg
        self.lay = detect_layout(tag_dir)
        # expert parallelism: the routed experts' param groups are partitioned over the expert-data-parallel group
        # (DP x CP / ep ranks holding the same expert shard): shard x's partition k is in DP rank x + ep k's file
        self.ep = layout_record.saved_layout(tag_dir).ep
        self.swiglu = model_cfg.activation == "swiglu"
        self._files: dict[str, dict] = {}
        self.buffers: dict[str, torch.Tensor] = {}  # shards.STATE_BUFFERS, whole (filled with the module keys)
        lay = self.lay
        # canonical name -> (stage, group, offset in the flat group, local shape); groups are laid out alike on every
        # TP rank. A tied embedding's second copy (the last stage's, `tied_modules.embed.*`) is not indexed: the
        # pipeline all-reduces the two copies' gradients, so they are the same tensor (the readers take the first).
        self.index: dict[str, tuple] = {}
        self.order: list[str] = []  # model.parameters() order over all stages
        self.part: dict[tuple[int, int], int] = {}  # (stage, group) -> DP partition size
        first = self.load(model_states_name(0))
        self.model_states = {k: v for k, v in first.items() if k not in ("module", "param_shapes")}
        self.module_keys = self._module_keys(first)
        optim = self.load(optim_name(tag_dir, 0, 0))["optimizer_state_dict"]
        self.moe_groups = {g for g, pg in enumerate(optim["base_optimizer_state"]["param_groups"]) if pg.get("moe")}
        counts = optim.get("partition_count") or []  # each group's process group size (EDP for the experts')
        for stage in range(lay.pp):
            shapes = self.load(model_states_name(stage * lay.tp))["param_shapes"]
            stage_names = []
            for g, od in enumerate(shapes):
                off = 0
                for raw, shape in od.items():
                    name = canonical_name(raw)
                    if name not in self.index:
                        self.index[name] = (stage, g, off, tuple(shape))
                        stage_names.append(name)
                    off += math.prod(shape)
                n = int(counts[g]) if g < len(counts) else lay.dp
                align = 2 * n  # DeepSpeed's nccl_start_alignment_factor x the group's DP size
                self.part[(stage, g)] = math.ceil(off / align) * align // n
            self.order += sorted(stage_names, key=_layer_rank(self.module_keys))
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
            return keys
        for stage in range(self.lay.pp):  # each stage's layers (the first stage's copy of a tied embedding)
            module = first["module"] if stage == 0 else self.load(model_states_name(stage * self.lay.tp))["module"]
            stage_keys: dict[int, list[str]] = {}
            for k in module:
                stage_keys.setdefault(int(k.split(".", 1)[0]), []).append(k)
                if is_state_buffer(k):  # the routing biases: model state outside the optimizer (replicated)
                    self.buffers.setdefault(canonical_name(k), module[k].float().clone())
            for layer, names in stage_keys.items():
                keys.setdefault(layer, names)
        return dict(sorted(keys.items()))

    def _partition(self, d: int, mp: int, g: int, kind: str) -> torch.Tensor:
        o = self.load(optim_name(self.dir, d, mp))["optimizer_state_dict"]
        if kind == "fp32":
            return o["single_partition_of_fp32_groups"][g]
        state = o["base_optimizer_state"]["state"]
        if not state:  # saved before the first optimizer step: Adam's moments are zero
            return torch.zeros(self.part[(mp // self.lay.tp, g)])
        return state[g][kind]

    def _local(self, mp: int, name: str, kind: str, shard: int = 0) -> torch.Tensor:
        """This model-parallel rank's tensor `name` (of expert shard `shard` for the routed experts)."""
        stage, g, off, shape = self.index[name]
        P, end, pieces = self.part[(stage, g)], off + math.prod(shape), []
        experts = g in self.moe_groups
        pos = off
        while pos < end:
            k = pos // P  # the partition: the DP rank (the EDP rank for the experts) that holds it
            hi = min(end, (k + 1) * P)
            d = shard + self.ep * k if experts else k
            pieces.append(self._partition(d, mp, g, kind)[pos - k * P:hi - k * P])
            pos = hi
        return torch.cat(pieces).view(shape)

    def full(self, name: str, kind: str) -> torch.Tensor:
        """Canonical full tensor (all source TP and EP shards merged, vocabulary padding removed), fp32."""
        if name in self.buffers:  # shards.STATE_BUFFERS: whole in the module states
            return self.buffers[name].clone()
        stage, g, tp = self.index[name][0], self.index[name][1], self.lay.tp
        if g in self.moe_groups:  # routed experts: [ep shard][tp rank]
            parts = [[self._local(stage * tp + t, name, kind, x) for t in range(tp)] for x in range(self.ep)]
            return merge_moe(name, parts, self.swiglu).float().clone()
        shards = [self._local(stage * tp + t, name, kind) for t in range(tp)]
        return strip_vocab(name, merge_tp(name, shards, self.swiglu).float(), self.cfg.vocab_size).clone()

    def full_shape(self, name: str) -> list[int]:
        shape = list(self.index[name][3])
        dim = expert_tp_dim(name) if is_moe_split(name) else split_dim(name)
        if dim is not None:
            shape[dim] *= self.lay.tp
        if self.index[name][1] in self.moe_groups:
            shape[0] *= self.ep  # the routed experts' EP split
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
    names: list[str] = field(default_factory=list)  # as the target's files name them
    canon: list[str] = field(default_factory=list)  # canonical names (what is read from the source)
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

    def clear(self) -> None:
        self.name, self.values = None, None

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


@dataclass
class Plan:
    """Everything a work item needs besides the open source files (picklable: it travels to the worker processes)."""

    tag_dir: Path
    out_tag: Path
    model_cfg: object
    tp: int
    pp: int
    dp: int
    zero: int
    padded: int
    swiglu: bool
    dtype: str
    stage_layers: list[list[int]]
    stage_groups: list[list[Group]]
    model_states: dict  # source mp rank 0's model-states entries (without module / param_shapes) + client state
    ds_config: dict
    version: str | None
    wd: float
    tied_copies: list[bool] = field(default_factory=list)  # per stage: layer 0 is a tied head's copy


def _layer(name: str) -> int:
    return int(name.split(".", 1)[0])


def _stage_params(src: Source, layers: list[int], tied_copy: bool) -> list[tuple[str, str]]:
    """(name in the target's files, canonical name) of one target stage, in its `model.parameters()` order: its
    layers in index order (recipes.model.layers.DecoderStack). `tied_copy`: the last stage of a pipeline holds a copy
    of a tied word embedding as layer 0 (its head), written from the one canonical tensor: the pipeline sums the two
    copies' gradients, so they are the same tensor."""
    names = [n for n in src.order if _layer(n) in layers]
    if tied_copy:
        names = [n for n in names if _layer(n) != 0 or n == TIED_COPY]
    return [(n, n) for n in names]


TIED_COPY = "0.word_embeddings.weight"


def _target_layers(src: Source, recipe, layout) -> list[tuple[list[int], bool]]:
    """Per target pipeline stage: the layers its DecoderStack holds, and whether layer 0 is a copy (the last stage's
    embedding for a tied head or model.mtp's depths)."""
    from recipes.parallel.partition import rank_layers

    cfg = recipe.model
    if layout.pp == 1:
        return [(sorted(src.module_keys), False)]
    head = cfg.num_layers + 2
    out = []
    for held in rank_layers(cfg, layout.tp, layout.pp, layout.vpp, recipe.parallel.pipeline_partition, layout.ep):
        copy = (cfg.tied_embeddings or cfg.mtp is not None) and head in held and 0 not in held
        out.append((sorted((({0} if copy else set()) | set(held)) & set(src.module_keys)), copy))
    return out


def _plan(src: Source, tag_dir: Path, out_tag: Path, recipe, layout) -> Plan:
    from recipes.parallel.ds_config import build_ds_config

    cfg = recipe.model
    tp, pp = layout.tp, layout.pp
    padded = cfg.padded_vocab_size(tp)
    stage_layers, stage_groups, copies = [], [], []
    for layers, copy in _target_layers(src, recipe, layout):
        groups = [Group(decay=True), Group(decay=False)]
        for name, canon in _stage_params(src, layers, copy):
            shape = _local_shape(canon, src.full_shape(canon), tp, padded)
            grp = groups[0 if len(shape) >= 2 else 1]
            grp.names.append(name)
            grp.canon.append(canon)
            grp.offsets.append(grp.numel)
            grp.shapes.append(shape)
            grp.numel += math.prod(shape)
        stage_layers.append(layers)
        copies.append(copy)
        stage_groups.append([g for g in groups if g.names])  # DeepSpeed drops an empty param group
    opt = recipe.training.optimizer
    return Plan(tag_dir=tag_dir, out_tag=out_tag, model_cfg=cfg, tp=tp, pp=pp, dp=layout.dp,
                zero=layout.zero_stage, padded=padded, swiglu=cfg.activation == "swiglu",
                dtype=recipe.training.precision, stage_layers=stage_layers, stage_groups=stage_groups,
                model_states={**src.model_states, "client_state": marked_client_state(tag_dir)},
                ds_config=build_ds_config(recipe, layout), version=src.model_states.get("ds_version"),
                wd=opt.weight_decay if opt.type == "adamw" else 0.0, tied_copies=copies)


def default_workers(items: int) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), items))


def relayout(tag_dir: Path, out: Path, recipe, layout, quiet: bool = False, workers: int | None = None) -> dict:
    """Write the checkpoint at `tag_dir` into `out` (a checkpoint.dir) at `layout` for `recipe` (the target recipe).

    The work items are the target's (pipeline stage, TP rank) pairs: each writes its layer files, its model-states
    file and its DP ranks' optimizer files, and touches no other item's files, so `workers` processes (default: one
    per core, at most one per item) write them side by side; every process holds at most one full tensor and one
    DP rank's partition. The files do not depend on the number of workers. Returns figures: seconds, bytes written,
    files, workers, and the largest peak RSS of a worker (bytes)."""
    t0 = time.time()
    src = Source(tag_dir, recipe.model)
    client_state = marked_client_state(tag_dir)
    step = int(client_state.get("step", 0))
    tag = tag_for(step)
    out_tag = out / tag
    out_tag.mkdir(parents=True, exist_ok=True)
    plan = _plan(src, tag_dir, out_tag, recipe, layout)
    items = [(stage, t) for stage in range(plan.pp) for t in range(plan.tp)]
    workers = default_workers(len(items)) if workers is None else max(1, min(workers, len(items)))
    totals = {"bytes": 0, "files": 0, "peak_rss": 0}

    def done(result: dict, n_done: int) -> None:
        for k in ("bytes", "files"):
            totals[k] += result[k]
        totals["peak_rss"] = max(totals["peak_rss"], result["peak_rss"])
        if not quiet:
            secs = time.time() - t0
            eta = secs / n_done * (len(items) - n_done)
            log.info(f"relayout: {n_done}/{len(items)} (stage, TP rank) items written by {workers} worker(s): "
                     f"{totals['files']} files, {totals['bytes'] / 2**20:.1f} MiB, "
                     f"{totals['bytes'] / 2**20 / max(secs, 1e-9):.1f} MiB/s, ETA {eta:.0f} s")

    if workers == 1:
        for i, (stage, t) in enumerate(items, 1):
            done(_write_item(plan, src, stage, t), i)
    else:
        _run_pool(plan, items, workers, done)
    fsync_dir(str(out_tag))  # every file is fsynced (write_durably); their names too, before complete.json vouches
    write_recipe(recipe, out)
    mark_complete(out, tag, step, client_state, recipe.checkpoint.keep_last, layout_record.record(recipe, layout))
    return {"seconds": time.time() - t0, "bytes": totals["bytes"], "files": totals["files"], "workers": workers,
            "worker_peak_rss": totals["peak_rss"]}


# Each worker process opens the source once (memory-mapped, released after every tensor) and writes whole items.
_WORKER_SOURCE: Source | None = None


def _init_worker(tag_dir: Path, model_cfg) -> None:
    global _WORKER_SOURCE
    torch.set_num_threads(1)  # the items are the parallelism; intra-op threads would only contend for the cores
    _WORKER_SOURCE = Source(tag_dir, model_cfg)


def _item_in_worker(plan: Plan, stage: int, t: int) -> dict:
    return _write_item(plan, _WORKER_SOURCE, stage, t)


def _run_pool(plan: Plan, items: list[tuple[int, int]], workers: int, done) -> None:
    # fork: the workers start without re-importing torch and DeepSpeed (seconds each, and their pages are shared);
    # the parent has no threads of its own running at this point.
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(plan.tag_dir, plan.model_cfg)) as pool:
        futures = [pool.submit(_item_in_worker, plan, stage, t) for stage, t in items]
        try:
            for n, fut in enumerate(as_completed(futures), 1):
                done(fut.result(), n)
        except BaseException:
            for fut in futures:  # one item failed (or Ctrl-C): write no more, the caller removes the partial output
                fut.cancel()
            raise


def _write_item(plan: Plan, src: Source, stage: int, t: int) -> dict:
    """Target pipeline stage `stage`, TP rank `t`: its model-states file (its layers' weights in it) and one
    optimizer file per DP rank."""
    cache = _OneTensorCache(src)
    figures = {"bytes": 0, "files": 0}
    digests: dict[str, str] = {}

    def save(obj, name):
        figures["bytes"] += write_durably(obj, plan.out_tag / name, digests=digests)  # fsynced: complete.json follows
        figures["files"] += 1

    module = _write_weights(plan, src, cache, stage, t, save)
    mp = stage * plan.tp + t
    save(_model_states(plan, stage, module), model_states_name(mp))
    del module
    for d in range(plan.dp):
        save(_optim_file(plan, src, cache, plan.stage_groups[stage], t, d), optim_file_name(d, mp))
    checksums.record(plan.out_tag, f"mp{mp}", digests)
    cache.clear()  # release the last tensor before the next item
    figures["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return figures


def _write_weights(plan: Plan, src: Source, cache: _OneTensorCache, stage: int, t: int, save) -> OrderedDict:
    """The module of one target stage and TP rank (its layers' TP shards, canonical names) for its model-states
    file."""
    dtype = _DTYPES[plan.dtype]
    module = OrderedDict()
    copy = plan.tied_copies[stage] if plan.tied_copies else False
    for L in plan.stage_layers[stage]:
        keys = [TIED_COPY] if copy and L == 0 else src.module_keys[L]
        for key in keys:
            module[key] = None  # `_extra_state` entries (the parameters are filled in)
            if key in src.index:
                full = pad_vocab(key, cache.get(key, ("fp32",))["fp32"], plan.padded)
                module[key] = split_tp(key, full, plan.tp, t, plan.swiglu).to(dtype).clone()
    return module


def _model_states(plan: Plan, stage: int, module: OrderedDict) -> dict:
    """The model-states file of one model-parallel rank (DP rank 0's): the source's entries at the target layout."""
    groups = plan.stage_groups[stage]
    model_states = {k: v for k, v in plan.model_states.items() if k != "client_state"}
    lr_sched = dict(model_states.get("lr_scheduler") or {})
    for key in ("base_lrs", "_last_lr", "lr_lambdas"):
        if key in lr_sched:
            lr_sched[key] = [lr_sched[key][0]] * len(groups)
    model_states.update(
        module=module, optimizer=None, lr_scheduler=lr_sched,
        param_shapes=[OrderedDict((n, torch.Size(s)) for n, s in zip(g.names, g.shapes)) for g in groups],
        dp_world_size=plan.dp, mp_world_size=plan.tp * plan.pp, ds_config=plan.ds_config,
        checkpoint_parallel_dimensions={"pp_degree": plan.pp, "tp_degree": plan.tp})  # as DeepSpeed's engine writes
    model_states.update(plan.model_states["client_state"])
    return model_states


def _optim_file(plan: Plan, src: Source, cache: _OneTensorCache, groups: list[Group], t: int, d: int) -> dict:
    """DP rank d's ZeRO optimizer file of TP rank t, as DeepSpeed's `state_dict()` writes it (rigid checkpoint)."""
    masters, state, paddings, mappings, param_groups = [], {}, [], [], []
    for gi, g in enumerate(groups):
        P = g.partition(plan.dp)
        lo, hi = d * P, (d + 1) * P
        flat, mapping = _fill_partition(plan, cache, g, t, lo, hi)
        pad = P if g.numel <= lo else (hi - g.numel if g.numel < hi else 0)
        masters.append(flat["fp32"][:P - pad].clone())
        entry = {"exp_avg": flat["exp_avg"], "exp_avg_sq": flat["exp_avg_sq"]}
        if src.step is not None:
            entry = {"step": src.step.clone(), **entry}
        state[gi] = entry
        paddings.append(pad)
        mappings.append(mapping)
        param_groups.append({**src.param_group, "weight_decay": plan.wd if g.decay else 0.0, "params": [gi]})
    base = {"state": state if src.step is not None else {}, "param_groups": param_groups}
    return {"optimizer_state_dict": {
        **src.optim_globals, "base_optimizer_state": base, "single_partition_of_fp32_groups": masters,
        "zero_stage": deepspeed_private.zero_stage_enum(plan.zero),
        "group_paddings": paddings, "param_alignment_paddings": [[0] * len(g.names) for g in groups],
        "partition_count": [plan.dp] * len(groups), "ds_version": plan.version, "param_slice_mappings": mappings},
        "ds_config": plan.ds_config, "ds_version": plan.version}


def _fill_partition(plan: Plan, cache: _OneTensorCache, g: Group, t: int, lo: int, hi: int) -> tuple[dict, OrderedDict]:
    """The flat [lo, hi) slice of param group `g` (masters and moments) of TP rank t, and where each parameter's
    fragment sits in it."""
    flat = {k: torch.zeros(hi - lo) for k in _KINDS}
    mapping = OrderedDict()
    for name, canon, off, shape in zip(g.names, g.canon, g.offsets, g.shapes):
        end = off + math.prod(shape)
        if end <= lo or off >= hi:
            continue
        a, b = max(off, lo), min(end, hi)
        for k, full in cache.get(canon).items():
            local = split_tp(canon, pad_vocab(canon, full, plan.padded), plan.tp, t, plan.swiglu).reshape(-1)
            flat[k][a - lo:b - lo] = local[a - off:b - off]
        mapping[name] = deepspeed_private.fragment_address(numel=b - a, start=a - lo)
    return flat, mapping

"""A `recipes train --local N` run observed from inside its ranks: what each rank held and which process groups its
collectives went over, for the tests that prove a parallel feature is really on (not silently plain TP/DP).

`python -m tests.support.observed OUT train ...` (what `tests.support.runs.pretrain(..., observe=OUT)` runs, forked
from the tests' template) patches, in the launcher process, before it forks the ranks (they inherit the patches):
- the collective clock of the training loop (recipes.train.stragglers.CommClock, which wraps every torch.distributed
  call): each call made inside a training step is counted per (call, global ranks of its group), with the shapes of
  its tensors;
- the trainer's engine build (recipes.train.trainer.initialize): a forward hook records the shape of the hidden state
  entering each decoder layer in training, and each MoE layer's expert weights are copied;
- the trainer's `finish`: the rank writes OUT/rank-R.json (`Evidence`): the steps it trained, its collectives, the
  layer inputs, its parameters (shapes, elements held: a ZeRO-3 partition), its optimizer state (elements of Adam's
  first moment, the fp32 masters), its experts (global indices, shapes, whether it stepped them) and its pipeline
  stages.
Nothing of this is in the product; the run itself is the one the parity tests compare with the 1-process losses.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import runpy
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

MAX_SHAPES = 8  # distinct tensor shape lists counted per (call, group); the rest counted without a shape


class CollectiveLog:
    """torch.distributed calls inside training steps: (call, group ranks) -> count and tensor shapes."""

    def __init__(self):
        self.calls: dict = defaultdict(lambda: {"calls": 0, "elements": 0, "shapes": {}})
        self.steps = 0
        self._signatures: dict = {}
        self._ranks: dict = {}

    def record(self, fn, args, kwargs) -> None:
        name = getattr(fn, "__name__", "")
        if not getattr(fn, "__module__", "").startswith("torch.distributed"):
            return  # an async call's wait(): counted where it was issued
        if name == "batch_isend_irecv":
            for op in args[0] if args else kwargs["p2p_op_list"]:
                self._add(op.op.__name__, op.group, [op.tensor])
            return
        bound = dict(zip(self._parameters(fn), args), **kwargs)
        tensors = [v for v in bound.values() if hasattr(v, "shape")]
        tensors += [t for v in bound.values() if isinstance(v, (list, tuple)) for t in v if hasattr(t, "shape")]
        self._add(name, bound.get("group"), tensors)

    def _parameters(self, fn) -> list[str]:
        if fn not in self._signatures:
            self._signatures[fn] = list(inspect.signature(fn).parameters)
        return self._signatures[fn]

    def _group_ranks(self, group) -> tuple[int, ...]:
        import torch

        key = id(group)
        if key not in self._ranks:
            self._ranks[key] = tuple(range(torch.distributed.get_world_size()) if group is None
                                     else torch.distributed.get_process_group_ranks(group))
        return self._ranks[key]

    def _add(self, name: str, group, tensors) -> None:
        entry = self.calls[(name, self._group_ranks(group))]
        entry["calls"] += 1
        entry["elements"] += max((t.numel() for t in tensors), default=0)  # a gather's output, a scatter's input
        shapes = tuple(tuple(t.shape) for t in tensors)
        if shapes not in entry["shapes"] and len(entry["shapes"]) >= MAX_SHAPES:
            shapes = None  # token exchanges: a new shape per call
        entry["shapes"][shapes] = entry["shapes"].get(shapes, 0) + 1

    def as_list(self) -> list[dict]:
        return [{"call": name, "group": list(group), "calls": entry["calls"], "elements": entry["elements"],
                 "shapes": [{"shapes": None if k is None else [list(shape) for shape in k], "calls": n}
                            for k, n in entry["shapes"].items()]}
                for (name, group), entry in sorted(self.calls.items())]


LOG = CollectiveLog()
_layer_inputs: dict[str, list[int]] = {}
_experts_at_start: dict = {}


def _watch_collectives() -> None:
    from recipes.train.stragglers import CommClock

    timed, start = CommClock._timed, CommClock.start

    def recorded(self, fn, *args, **kwargs):
        LOG.record(fn, args, kwargs)
        return timed(self, fn, *args, **kwargs)

    def counted_start(self, device):
        LOG.steps += 1
        return start(self, device)

    CommClock._timed, CommClock.start = recorded, counted_start


def _watch_engine() -> None:
    from recipes.train import trainer

    build = trainer.initialize

    def observed_initialize(recipe, layout, device, total_steps):
        eng = build(recipe, layout, device, total_steps)
        _hook_layer_inputs(eng.module)
        for layer in _moe_layers(eng.module):
            _experts_at_start[layer.layer_number] = [p.detach().clone() for p in layer.experts.parameters()]
        return eng

    trainer.initialize = observed_initialize
    finish = trainer.Trainer.finish

    def observed_finish(self):
        _write(self, Path(os.environ["OBSERVED_DIR"]))
        return finish(self)

    trainer.Trainer.finish = observed_finish


def _hook_layer_inputs(module) -> None:
    from recipes.model.layers import DecoderLayerPipe

    for name, layer in module.named_modules():
        if isinstance(layer, DecoderLayerPipe):
            def hook(mod, inputs, name=name):
                hidden = inputs[0][0] if isinstance(inputs[0], tuple) else inputs[0]
                if mod.training and name not in _layer_inputs:
                    _layer_inputs[name] = list(hidden.shape)
            layer.register_forward_pre_hook(hook)


def _moe_layers(module):
    from recipes.model.moe import moe_layers

    return moe_layers(module)


def _held(p) -> tuple[list[int], int]:
    """(full shape, elements this rank holds): a ZeRO-3 parameter is a placeholder with its partition in ds_tensor."""
    if hasattr(p, "ds_tensor"):
        return list(p.ds_shape), p.ds_tensor.numel()
    return list(p.shape), p.numel()


def _optimizer_state(engine) -> dict:
    """Elements of Adam's first moment this rank keeps (its torch optimizer's state) and of its fp32 masters."""
    import torch

    inner = engine.optimizer
    while not isinstance(inner, torch.optim.Optimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    exp_avg = sum(s["exp_avg"].numel() for s in inner.state.values() if "exp_avg" in s)
    masters = None
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        if hasattr(engine.optimizer, attr):
            masters = sum(t.numel() for t in getattr(engine.optimizer, attr))
    moe_masters, flats = None, getattr(engine.optimizer, "single_partition_of_fp32_groups", None)
    if flats is not None and len(flats) == len(inner.param_groups):  # ZeRO-1/2: one flat partition per group
        moe_masters = sum(t.numel() for t, g in zip(flats, inner.param_groups) if g.get("moe"))
    return {"exp_avg_numel": exp_avg, "masters_numel": masters, "expert_masters_numel": moe_masters}


def _experts(module) -> list[dict]:
    out = []
    for layer in _moe_layers(module):
        start = _experts_at_start.get(layer.layer_number, [])
        now = [p.detach() for p in layer.experts.parameters()]
        local = layer.dispatcher.local_experts
        stepped = [bool((a != b).flatten(1).any(dim=1).all()) for a, b in zip(start, now, strict=True)]
        out.append({"layer": layer.layer_number, "experts": list(local),
                    "shapes": [list(p.shape) for p in now], "every_expert_stepped": all(stepped)})
    return out


def _write(trainer_obj, out: Path) -> None:
    import torch

    eng = trainer_obj.eng
    rank = torch.distributed.get_rank()
    pipeline = None
    if eng.pipeline is not None:
        runner = eng.pipeline
        pipeline = {"schedule": type(runner.schedule).__name__, "stages": list(runner.model.stages),
                    "num_stages": runner.model.num_stages, "micro_batches": runner.m,
                    "chunks": [list(c.indices) for c in runner.model.chunks]}
    params = {n: dict(zip(("shape", "held"), _held(p), strict=True)) for n, p in eng.module.named_parameters()}
    evidence = {"rank": rank, "world": torch.distributed.get_world_size(), "steps": LOG.steps,
                "layout": trainer_obj.layout.describe(), "collectives": LOG.as_list(),
                "layer_inputs": dict(_layer_inputs), "params": params, "optimizer": _optimizer_state(eng.engine),
                "experts": _experts(eng.module), "pipeline": pipeline}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(evidence, indent=1))


# ------------------------------------------------------------------------------------------ reading the evidence
@dataclass
class Observed:
    """One observed run: its checkpoint.dir (logs/metrics.jsonl there) and each rank's evidence, by rank."""
    run_dir: Path
    ranks: list[dict]


def read(out: Path) -> list[dict]:
    files = sorted(Path(out).glob("rank-*.json"), key=lambda f: int(f.stem.split("-")[1]))
    return [json.loads(f.read_text()) for f in files]


class ObservedRuns:
    """Runs made once per test module and observed: the parity test and the proof test of a case read the same run.
    `make(name, run_dir, observe_dir)` trains case `name`."""

    def __init__(self, tmp_path_factory, make):
        self.factory, self.make, self.made = tmp_path_factory, make, {}

    def __call__(self, name: str) -> Observed:
        if name not in self.made:
            base = self.factory.mktemp(name)
            self.make(name, base / "run", base / "observed")
            ranks = read(base / "observed")
            assert ranks and [e["rank"] for e in ranks] == list(range(ranks[0]["world"])), (
                f"{name}: not every rank wrote its evidence ({[e['rank'] for e in ranks]})")
            self.made[name] = Observed(base / "run", ranks)
        return self.made[name]


def mesh_group(rank: int, axis: str, sizes: list[tuple[str, int]]) -> list[int]:
    """The global ranks of `rank`'s group along `axis` of a mesh whose axes, fastest first, are `sizes`, e.g.
    [("tp", 2), ("cp", 1), ("dp", 2), ("pp", 2)]: megatron-core's rank order tp-cp-dp-pp, computed here on its own."""
    coords, rest = {}, rank
    for name, n in sizes:
        coords[name], rest = rest % n, rest // n
    group = []
    for v in range(dict(sizes)[axis]):
        c, index, stride = dict(coords, **{axis: v}), 0, 1
        for name, n in sizes:
            index, stride = index + c[name] * stride, stride * n
        group.append(index)
    return group


def layout_dims(ranks: int, overrides: list[str], config: str | None = None) -> dict:
    """The parallel sizes a run of `ranks` processes with `overrides` asks for (as the recipe states them), the
    micro-batches each rank runs per step, and the rank meshes (fastest axis first) of its dense and expert groups."""
    from recipes.config.loading import load_recipe
    from tests.support.runs import RECIPE

    recipe = load_recipe(config or RECIPE, [o for o in overrides if o.startswith(("parallel.", "training.", "model."))])
    par = recipe.parallel
    tp, cp, pp, ep = par.tp, par.cp, par.pp, par.ep
    dp = ranks // (tp * cp * pp)
    return {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "vpp": par.vpp, "sp": par.sequence_parallel,
            "zero": par.zero_stage, "micro_batches": recipe.training.global_batch // (par.micro_batch * dp),
            "mesh": [("tp", tp), ("cp", cp), ("dp", dp), ("pp", pp)],
            "expert_mesh": [("tp", tp), ("ep", ep), ("edp", cp * dp // ep), ("pp", pp)]}


def calls_on(e: dict, names: tuple[str, ...], group: list[int], where=None) -> int:
    """Calls of `names` this rank made on `group` in its training steps; with `where`, only those whose tensor shapes
    (as recorded: the first MAX_SHAPES distinct ones) pass it."""
    found = [c for c in e["collectives"] if c["call"] in names and c["group"] == sorted(group)]
    if where is None:
        return sum(c["calls"] for c in found)
    return sum(entry["calls"] for c in found for entry in c["shapes"]
               if entry["shapes"] is not None and where(entry["shapes"]))


def elements_on(e: dict, names: tuple[str, ...], group: list[int]) -> int:
    """Elements every call of `names` on `group` moved: of its largest tensor (the output of a gather, the input of a
    reduce-scatter, the tensor of an all-reduce)."""
    return sum(c["elements"] for c in e["collectives"] if c["call"] in names and c["group"] == sorted(group))


def collectives(e: dict) -> str:
    """This rank's calls, one per (call, group), for a failure message."""
    return "; ".join(f"{c['call']} on {c['group']} x{c['calls']}" for c in e["collectives"])


def params_numel(e: dict) -> int:
    return sum(math.prod(p["shape"]) for p in e["params"].values())


def main() -> None:
    out, *argv = sys.argv[1:]
    os.environ["OBSERVED_DIR"] = str(Path(out).resolve())  # the ranks' environment is the launcher's
    _watch_collectives()
    _watch_engine()
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module("recipes", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

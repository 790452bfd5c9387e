"""Write a training checkpoint at any layout from a full state directory: the engine is built at the target layout
(one process per rank, torchrun on this machine, CPU/gloo), every rank cuts its TP shard out of the full tensors,
puts weights, fp32 masters and Adam moments where DeepSpeed keeps them, and `recipes.checkpoint.store.save` writes the
DeepSpeed files + complete.json. `python -m recipes train` at that layout then resumes from it as from its own.

Full state directory (written by `recipes.tools.reshape` and `recipes.hf.importer`; documented format):
  weights.safetensors      canonical names (see recipes.checkpoint.shards), fp32, vocabulary unpadded
  exp_avg.safetensors      Adam first moments, same names/shapes (optional: absent = fresh optimizer)
  exp_avg_sq.safetensors   Adam second moments (with exp_avg)
  meta.json                client_state (step, consumed_samples, ...), optimizer_step, param_group_lrs,
                           lr_scheduler state, source_layout
  recipe.yaml              the full recipe at the target layout (parallel.tp/pp/dp/zero_stage)
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch

from recipes.checkpoint.recipe_file import RECIPE_FILE, write_recipe
from recipes.checkpoint.shards import canonical_name, pad_vocab, split_tp
from recipes.parallel.expert_shards import is_moe_split, split_moe

log = logging.getLogger(__name__)

WEIGHTS, EXP_AVG, EXP_AVG_SQ, META = "weights.safetensors", "exp_avg.safetensors", "exp_avg_sq.safetensors", "meta.json"


# ------------------------------------------------------------------------------------------------- full state dir
def save_full_state(out: Path, weights: dict, meta: dict, recipe, exp_avg: dict | None = None,
                    exp_avg_sq: dict | None = None) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / WEIGHTS))
    if exp_avg is not None:
        save_file({k: v.contiguous() for k, v in exp_avg.items()}, str(out / EXP_AVG))
        save_file({k: v.contiguous() for k, v in exp_avg_sq.items()}, str(out / EXP_AVG_SQ))
    write_recipe(recipe, out)
    (out / META).write_text(json.dumps(meta, indent=1))


def write_checkpoint(state_dir: Path, out_dir: Path, world_size: int, quiet: bool = False, timeout: int = 1800) -> None:
    """Run the writer on `world_size` local processes (torchrun); raises with the ranks' output on failure."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), CUDA_VISIBLE_DEVICES="",
               PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
           "-m", "recipes.train.state_writer", "--state", str(state_dir), "--out", str(out_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=Path(__file__).resolve().parents[2])
    if proc.returncode != 0:
        raise RuntimeError(f"checkpoint writer failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-4000:]}")
    if not quiet:  # the ranks' own log lines about the save, once (rank 0 logs them)
        for line in proc.stderr.splitlines():
            if line.startswith("checkpoint:"):
                log.info(line)


# ------------------------------------------------------------------------------------------------- in each rank
def publish_checkpoint(out: Path, world_size: int, weights: dict, meta: dict, recipe, exp_avg: dict | None = None,
                       exp_avg_sq: dict | None = None, quiet: bool = False) -> Path:
    """Full state -> a training checkpoint at `recipe`'s layout, built in a hidden sibling directory and renamed to
    `out` only when complete, so an interrupted import/reshape never leaves anything that looks like a checkpoint."""
    import shutil
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        save_full_state(work / "full_state", weights, meta, recipe, exp_avg, exp_avg_sq)
        write_checkpoint(work / "full_state", work / "checkpoint", world_size, quiet=quiet)
        if out.exists():
            out.rmdir()  # callers refuse a non-empty out; an empty one is replaced
        os.replace(work / "checkpoint", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _zero_optimizer(eng):
    opt = eng.engine.optimizer
    return opt if hasattr(opt, "single_partition_of_fp32_groups") else None


def _install(eng, recipe, tensors: dict, moments: tuple | None, meta: dict) -> None:
    """Put this rank's shards of the full state into the live engine."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state
    from megatron.core import parallel_state

    m = recipe.model
    tp, tp_rank = eng.layout.tp, parallel_state.get_tensor_model_parallel_rank()
    swiglu = m.activation == "swiglu"
    padded = m.padded_vocab_size(tp)
    zero = _zero_optimizer(eng)
    step = meta.get("optimizer_step")

    ep, ep_rank = parallel_state.get_expert_model_parallel_world_size(), parallel_state.get_expert_model_parallel_rank()

    def local(source, name, like):
        full = pad_vocab(name, source.get_tensor(name).float(), padded)
        if is_moe_split(name):  # experts split over EP and TP (recipes.parallel.expert_shards)
            t = split_moe(name, full, tp, tp_rank, ep, ep_rank, swiglu)
        else:
            t = split_tp(name, full, tp, tp_rank, swiglu)
        if tuple(t.shape) != tuple(like.shape):
            raise ValueError(f"{name}: shard {tuple(t.shape)} does not fit the model's {tuple(like.shape)}")
        return t.to(like.device)

    if moments is not None and zero is not None:
        # ZeRO-1/2 create Adam's state lazily at the first step; create it here (zeros, the saved step count) and
        # let DeepSpeed link each parameter's fragment of it, then fill the fragments.
        for flat in zero.single_partition_of_fp32_groups:
            zero.optimizer.state[flat] = {"step": torch.tensor(float(step or 0)),
                                          "exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)}
        zero._lazy_init_hp_params_optimizer_state()
    names = set(tensors.keys())
    for raw, p in eng.module.named_parameters():
        name = canonical_name(raw)
        if name not in names:
            raise ValueError(f"the full state has no '{name}' (recipe and state do not match)")
        value = local(tensors, name, p)
        with torch.no_grad():
            p.data.copy_(value.to(p.dtype))
        if zero is not None:
            safe_set_full_fp32_param(p, value)
        if moments is not None:
            a, b = local(moments[0], name, p), local(moments[1], name, p)
            if zero is not None:
                safe_set_full_optimizer_state(p, a, "exp_avg")
                safe_set_full_optimizer_state(p, b, "exp_avg_sq")
            else:  # ZeRO-0: the torch optimizer holds the (TP-local) parameter itself
                eng.optimizer.state[p] = {"step": torch.tensor(float(step or 0)), "exp_avg": a.clone(),
                                          "exp_avg_sq": b.clone()}
    if moments is not None:
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


def _rank_main(state_dir: Path, out_dir: Path) -> int:
    from safetensors import safe_open

    from recipes.checkpoint import store as checkpoint
    from recipes.train.engine import init_distributed, init_parallel_state, initialize
    from recipes.parallel.layout import Layout
    from recipes.config.loading import load_recipe
    from recipes.config.logs import setup_logging

    setup_logging()
    recipe = load_recipe(str(state_dir / RECIPE_FILE), ["cluster.device=cpu", "cluster.backend=gloo"])
    meta = json.loads((state_dir / META).read_text())
    device = init_distributed(recipe)
    layout = Layout.from_recipe(recipe, torch.distributed.get_world_size())
    init_parallel_state(layout)
    eng = initialize(recipe, layout, device, recipe.training.steps(recipe.model.seq_length))
    tensors = safe_open(str(state_dir / WEIGHTS), "pt")
    moments = None
    if (state_dir / EXP_AVG).is_file():
        moments = (safe_open(str(state_dir / EXP_AVG), "pt"), safe_open(str(state_dir / EXP_AVG_SQ), "pt"))
    _install(eng, recipe, tensors, moments, meta)
    cs = meta["client_state"]
    rank0 = torch.distributed.get_rank() == 0
    checkpoint.save(eng.engine, str(out_dir), int(cs.get("step", 0)), cs, keep_last=recipe.checkpoint.keep_last)
    if rank0:
        (Path(out_dir) / RECIPE_FILE).write_text((state_dir / RECIPE_FILE).read_text())
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipes.train.state_writer", description=__doc__.split("\n")[0])
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ns = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    return _rank_main(ns.state, ns.out)


if __name__ == "__main__":
    sys.exit(main())

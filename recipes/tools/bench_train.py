"""Training-step benchmark (not a test).

CPU (default): the recipe's engine at TP=1 x PP=1 x DP=1 vs a minimal plain-PyTorch loop (same model class, same
batch, torch AdamW, clip, schedule) in one process; prints both median step times and their ratio (goal <= 1.15).

GPU (`--gpu`, one process per GPU under torchrun, or one GPU alone): trains the recipe's model for N steps on
synthetic tokens at the recipe's layout and prints tokens/s, TFLOP/s per GPU and MFU (model FLOPs from recipes.model.shape).

  python -m recipes bench train --config configs/runs/tiny-cpu.yaml --steps 20
  torchrun --nproc-per-node 1 -m recipes bench train --gpu --config configs/runs/bench-gpt-1.3b-1gpu.yaml --steps 20
"""
from __future__ import annotations

import json
import os
import statistics
import time
import warnings

import torch

from recipes.config.cli_help import command_parser

warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")


def synthetic_steps(recipe, layout, device, steps: int, seed: int = 0):
    """Per step, this DP rank's micro-batches of random tokens (same for every layout with the same seed)."""
    g = torch.Generator().manual_seed(seed)
    m = recipe.model
    ga = layout.grad_accum_steps(recipe.training.global_batch)
    out = []
    for _ in range(steps):
        mbs = []
        for _ in range(ga):
            tokens = torch.randint(0, m.vocab_size, (layout.micro_batch, m.seq_length + 1), generator=g)
            mbs.append((tokens[:, :-1].to(device), (tokens[:, 1:].to(device),
                                                    torch.ones(layout.micro_batch, m.seq_length, device=device))))
        out.append(mbs)
    return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def engine_stepper(recipe, layout, device, total_steps: int):
    """One recipe training step per call (DeepSpeed engine, our train_step)."""
    from recipes.train.engine import initialize
    from recipes.train.step import train_step

    eng = initialize(recipe, layout, device, total_steps=total_steps)

    def step(mbs):
        return train_step(eng, mbs)

    step.attention_backend = eng.attention_backend
    return step


def plain_pytorch_stepper(recipe, layout, device, total_steps: int):
    """The baseline: what a hand-written loop over the same module does per step."""
    from recipes.train.engine import lr_multiplier
    from recipes.model.layers import PlainDecoder

    model = PlainDecoder(recipe, layout).to(device)
    o = recipe.training.optimizer
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                            weight_decay=o.weight_decay, fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(recipe, total_steps))

    def step(mbs):
        for tokens, (labels, mask) in mbs:
            (model(tokens, labels, mask) / len(mbs)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.training.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    return step


def time_steps(steppers: dict, batches, device, warmup: int) -> dict[str, list[float]]:
    """Alternate the steppers step by step, so load changes on a shared machine hit both alike."""
    times = {name: [] for name in steppers}
    for i, mbs in enumerate(batches):
        for name, step in steppers.items():
            _sync(device)
            t0 = time.perf_counter()
            step(mbs)
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def planner_comparison(recipe, layout, step_s: float, device) -> dict:
    """Measured step time and peak memory next to what the planner predicts for this recipe at this layout."""
    from recipes.planner.cost import estimate

    est = estimate(recipe.model, recipe.cluster, layout, recipe.training.global_batch,
                   precision=recipe.training.precision)
    out = {"predicted_step_time_s": est.time_s["step"], "step_time_vs_predicted": step_s / est.time_s["step"],
           "predicted_memory_gb": est.memory_gib["total"], "predicted_memory_breakdown_gb": est.memory_gib,
           "predicted_mfu": est.mfu}
    if device.type == "cuda":
        # The planner's total includes the CUDA context and allocator slack, so reserved memory is its counterpart;
        # allocated is reported too.
        out["max_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        out["max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / 2**30
        out["memory_vs_predicted"] = out["max_memory_reserved_gb"] / est.memory_gib["total"]
    return out


def profile_steps(step, batches, device, path: str) -> None:
    """torch.profiler over a few steps: the operators that take the time, as a text table."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for mbs in batches:
            step(mbs)
        _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    with open(path, "w") as f:
        f.write(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70))


def main(argv=None) -> int:
    ap = command_parser("python -m recipes bench train", __doc__)
    ap.add_argument("--config", default="configs/runs/tiny-cpu.yaml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gpu", action="store_true", help="GPU throughput mode (tokens/s, TFLOP/s per GPU, MFU)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--profile", help="after timing, profile 2 more steps with torch.profiler; summary to this file")
    ap.add_argument("overrides", nargs="*")
    ns = ap.parse_args(argv)
    from recipes.model.shape import model_flops_per_step

    recipe, layout, device, world = _setup(ns)
    rank0 = torch.distributed.get_rank() == 0

    total = ns.steps + ns.warmup
    steppers = {"recipe": engine_stepper(recipe, layout, device, total)}
    attention = steppers["recipe"].attention_backend
    if not ns.gpu:
        steppers["plain"] = plain_pytorch_stepper(recipe, layout, device, total)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    batches = synthetic_steps(recipe, layout, device, total)
    times = time_steps(steppers, batches, device, ns.warmup)
    step = statistics.median(times["recipe"])
    tokens = recipe.training.global_batch * recipe.model.seq_length
    tflops = model_flops_per_step(recipe.model, recipe.training.global_batch) / step / world / 1e12
    result = {"recipe": recipe.name, "layout": layout.describe(), "micro_batch": layout.micro_batch,
              "global_batch": recipe.training.global_batch, "device": str(device), "attention": attention,
              "step_time_s": step, "tokens_per_s": tokens / step, "tflops_per_gpu": tflops,
              "mfu": tflops / recipe.cluster.peak_tflops}
    if ns.gpu:
        result.update(planner_comparison(recipe, layout, step, device))
    if ns.profile and rank0:
        profile_steps(steppers["recipe"], batches[-2:], device, ns.profile)
    if not ns.gpu:
        plain = statistics.median(times["plain"])
        result.update({"plain_pytorch_step_time_s": plain, "overhead_ratio": step / plain})
    if rank0:
        _print_result(result, ns.json)
    torch.distributed.destroy_process_group()
    return 0


def _print_result(result: dict, json_path: str | None) -> None:
    for k, v in result.items():
        print(f"{k:>26}: {v:.4g}" if isinstance(v, float) else f"{k:>26}: {v}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)


def _setup(ns):
    """One process group and megatron-core's parallel state for the recipe (one CPU rank unless --gpu); the recipe,
    its layout, the device and the world size."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    from recipes.train import groups
    from recipes.train.engine import init_distributed
    from recipes.parallel.layout import Layout
    from recipes.config.loading import load_recipe
    from recipes.train.cli import validate_recipe

    overrides = list(ns.overrides)
    if not ns.gpu:
        overrides += ["parallel.tp=1", "parallel.pp=1", "parallel.dp=1", "cluster.device=cpu"]
    recipe = load_recipe(ns.config, overrides)
    world = int(os.environ["WORLD_SIZE"])
    validate_recipe(recipe, world)
    device = init_distributed(recipe)
    layout = Layout.from_recipe(recipe, world)
    groups.build(layout)
    torch.manual_seed(recipe.training.seed)
    if device.type == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(recipe.training.seed)
    return recipe, layout, device, world


if __name__ == "__main__":
    raise SystemExit(main())

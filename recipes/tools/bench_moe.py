"""Step time of a dense model vs a mixture of experts with the same ACTIVE size (not a test).

The MoE variant replaces every dense MLP of width f by E experts of width f / k with top-k routing: each token goes
through k x f / k = f MLP columns, as in the dense model, so the matmul FLOPs per token are equal (plus the router's
E x h); the MoE holds E / k times the MLP parameters. Both engines run in one process at TP=1 x PP=1 x DP=1 on the
same synthetic batches, step by step in alternation (a shared machine slows both alike); prints the median step
times, their ratio and the parameter counts.

  python -m recipes bench moe [--config configs/runs/demo-cpu.yaml] [--experts 8] [--top-k 2] [--steps 20] [overrides]
"""
from __future__ import annotations

import json
import os
import statistics
import warnings

import torch

from recipes.config.cli_help import command_parser

warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")


def main(argv=None) -> int:
    ap = command_parser("python -m recipes bench moe", __doc__)
    ap.add_argument("--config", default="configs/runs/demo-cpu.yaml")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("overrides", nargs="*")
    ns = ap.parse_args(argv)
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29519"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    from recipes.config.loading import load_recipe
    from recipes.model.shape import count_parameters
    from recipes.parallel.layout import Layout
    from recipes.tools.bench_train import engine_stepper, synthetic_steps, time_steps
    from recipes.train import groups
    from recipes.train.engine import init_distributed

    one = [*ns.overrides, "parallel.tp=1", "parallel.pp=1", "parallel.dp=1", "parallel.ep=1", "cluster.device=cpu",
           "model.moe="]
    dense = load_recipe(ns.config, one)
    f = dense.model.ffn_size
    moe = load_recipe(ns.config, [*one[:-1], f"model.moe.num_experts={ns.experts}", f"model.moe.top_k={ns.top_k}",
                                  f"model.moe.ffn_hidden_size={f // ns.top_k}", "model.moe.aux_loss_coeff=0.01"])
    device = init_distributed(dense)
    layout = Layout.from_recipe(dense, 1)
    groups.build(layout)
    total = ns.steps + ns.warmup
    steppers = {"dense": engine_stepper(dense, layout, device, total),
                "moe": engine_stepper(moe, layout, device, total)}
    times = time_steps(steppers, synthetic_steps(dense, layout, device, total), device, ns.warmup)
    d, m = statistics.median(times["dense"]), statistics.median(times["moe"])
    result = {"config": ns.config, "experts": f"{ns.experts} x ffn {f // ns.top_k}, top-{ns.top_k}",
              "dense_ffn": f, "dense_parameters": count_parameters(dense.model),
              "moe_parameters": count_parameters(moe.model), "moe_active_parameters": count_parameters(moe.model,
                                                                                                       active=True),
              "dense_step_s": d, "moe_step_s": m, "moe_vs_dense": m / d,
              "tokens_per_step": dense.training.global_batch * dense.model.seq_length,
              "load_avg": os.getloadavg()[0]}
    for k, v in result.items():
        print(f"{k:>22}: {v:.4g}" if isinstance(v, float) else f"{k:>22}: {v}")
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump(result, fh, indent=1)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

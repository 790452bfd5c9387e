"""`python -m recipes bench zero-memory`: measure real model-state memory per rank under ZeRO 0/1/2/3 with DeepSpeed on
CPU (gloo) and compare it with the planner's prediction.

Each rank builds the recipe's model through `recipes.train.engine.initialize` (the same path as training), runs one
optimizer step of two micro-batches on random tokens (Adam creates its moments then), then the backward passes of a
second step, and after each counts the bytes of every live tensor storage in the process (deduplicated, so
DeepSpeed's flat buffers and the parameter views into them count once), minus what was live before the engine
existed. DeepSpeed's reduce buckets (storages of exactly reduce_bucket_size elements) are reported apart. The
prediction is `planner.zero_model_state_bytes` at the same layout, and `planner.deepspeed_bucket_bytes`.

    python -m recipes bench zero-memory configs/runs/tiny-cpu.yaml --dp 2 model.hidden_size=512 \
        model.num_attention_heads=8 model.num_query_groups=8 model.ffn_hidden_size=1376 model.vocab_size=8192
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

from recipes.train import local_workers
from recipes.config.cli_help import command_parser

REPO = Path(__file__).resolve().parents[2]


def live_tensor_bytes(bucket_elements: float = 0) -> tuple[int, int]:
    """(bytes of all distinct tensor storages reachable from Python objects, bytes of those that are DeepSpeed
    reduce buckets, i.e. exactly `bucket_elements` elements of 2 or 4 bytes)."""
    import torch

    seen, total, buckets = set(), 0, 0
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                st = obj.untyped_storage()
                key = st.data_ptr()
                if key and key not in seen:
                    seen.add(key)
                    total += st.nbytes()
                    if bucket_elements and st.nbytes() in (2 * bucket_elements, 4 * bucket_elements):
                        buckets += st.nbytes()
        except Exception:  # noqa: BLE001 - some tensor subclasses refuse storage access; they hold no states here
            continue
    return total, buckets


def _worker(recipe_path: str, overrides: list[str], stages: list[int], dp: int) -> list[dict]:
    """One process of the measurement: every ZeRO stage in turn (imports and process groups are paid once)."""
    import torch

    from recipes.train import groups
    from recipes.train.engine import init_distributed, pick_device
    from recipes.parallel.layout import Layout
    from recipes.config.loading import load_recipe

    results = []
    for zero_stage in stages:
        recipe = load_recipe(recipe_path, overrides + [f"parallel.zero_stage={zero_stage}", "parallel.tp=1",
                                                       "parallel.pp=1", f"parallel.dp={dp}", "parallel.micro_batch=1",
                                                       f"training.global_batch={2 * dp}"])  # 2 micro-batches/step
        device = init_distributed(recipe) if not torch.distributed.is_initialized() else pick_device(recipe)
        layout = Layout.from_recipe(recipe, dp)
        groups.build(layout)
        results.append(_measure_stage(recipe, layout, device))
        gc.collect()
    return results


def _measure_stage(recipe, layout, device) -> dict:
    import torch

    from recipes.train.engine import initialize

    m = recipe.model
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, m.vocab_size, (1, m.seq_length), generator=gen)
    labels = torch.randint(0, m.vocab_size, (1, m.seq_length), generator=gen)
    mask = torch.ones(1, m.seq_length)
    gc.collect()
    before, _ = live_tensor_bytes()
    eng = initialize(recipe, layout, device, total_steps=2)
    bucket_elements = int(eng.ds_config["zero_optimization"].get("reduce_bucket_size", 0))
    # Two steps of two micro-batches. The first step creates Adam's moments (lazily); measure after each backward of
    # the second step (accumulating, then at the boundary), when parameters, gradients and optimizer states are live,
    # and keep the larger. `.grad` tensors have no Python object until touched: touch them so the census sees them.
    after, buckets = 0, 0
    for micro in range(4):
        loss = eng.engine(tokens, labels, mask)
        eng.engine.backward(loss)
        del loss
        if micro >= 2:
            grads = [p.grad for p in eng.module.parameters() if p.grad is not None]  # noqa: F841 - keeps them seen
            gc.collect()
            total, in_buckets = live_tensor_bytes(bucket_elements)
            if total > after:
                after, buckets = total, in_buckets
            del grads
        eng.engine.step()  # a no-op except at the accumulation boundary
    result = {"rank": torch.distributed.get_rank(), "zero_stage": layout.zero_stage,
              "model_states_bytes": after - before - buckets, "bucket_bytes": buckets}
    del eng
    return result


def measure(recipe_path: str, overrides: list[str], stages: list[int], dp: int, timeout: int = 600) -> list[list]:
    """Run `dp` local processes that measure each ZeRO stage in turn; per rank, a list of per-stage results."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "recipes", "bench", "zero-memory", recipe_path, *overrides, "--worker",
           "--stages", ",".join(map(str, stages)), "--dp", str(dp)]
    # fresh interpreters, never forks: a fork's inherited heap would be counted in the live-tensor census
    return [local_workers.last_json(o) for o in local_workers.fresh_outputs(dp, cmd, env, timeout)]


def main(argv=None) -> int:
    ap = command_parser("python -m recipes bench zero-memory", __doc__)
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_intermixed_args(argv)
    stages = [int(s) for s in args.stages.split(",")]
    if args.worker:
        print(json.dumps(_worker(args.recipe, args.overrides, stages, args.dp)), flush=True)
        return 0

    from recipes.config.loading import load_recipe
    from recipes.planner.cost import Assumptions, deepspeed_bucket_bytes, params_per_gpu, zero_model_state_bytes

    recipe = load_recipe(args.recipe, args.overrides)
    psi = params_per_gpu(recipe.model, 1, 1)
    # The workers run on CPU (CUDA_VISIBLE_DEVICES=""), so their DeepSpeed JSON has overlap_comm off: one bucket.
    assume = Assumptions.for_device("cpu")
    rows = []
    per_rank = measure(args.recipe, args.overrides, stages, args.dp)
    for i, stage in enumerate(stages):
        measured = max(r[i]["model_states_bytes"] for r in per_rank)
        measured_bucket = max(r[i]["bucket_bytes"] for r in per_rank)
        precision = recipe.training.precision
        states = sum(zero_model_state_bytes(psi, args.dp, stage, precision).values())
        bucket = deepspeed_bucket_bytes(psi, stage, args.dp, 4 if precision == "fp32" else 2, assume)
        rows.append({"zero_stage": stage, "dp": args.dp, "params": psi, "precision": precision,
                     "predicted_states_bytes": states, "measured_states_bytes": measured,
                     "states_ratio": measured / states, "predicted_bucket_bytes": bucket,
                     "measured_bucket_bytes": measured_bucket})
        if not args.json:
            print(f"ZeRO-{stage} dp={args.dp} {precision}: model states predicted {states / 2**20:7.1f} MiB, "
                  f"measured {measured / 2**20:7.1f} MiB per rank ({measured / states - 1:+.1%}); reduce bucket "
                  f"predicted {bucket / 2**20:6.1f} MiB, held after backward {measured_bucket / 2**20:6.1f} MiB",
                  flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

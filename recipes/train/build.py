"""What a run is built from, in the order every rank builds it: the run's directories, the parallel state and seeds,
the datasets and micro-batch streams (one dataset per data stage when the recipe has stages). The engine itself is
recipes.train.engine.initialize."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from recipes.config.stages import stage_plan
from recipes.parallel.layout import Layout
from recipes.train.data import MicroBatches, build_datasets
from recipes.train import groups
from recipes.train.stages import build_stage_datasets


@dataclass
class RunDirs:
    checkpoint: str | None  # checkpoint.dir (None: no checkpoints)
    logs: Path  # metrics.jsonl, TensorBoard, evaluation logs
    data_cache: str  # megatron-core's dataset index cache


def run_dirs(recipe) -> RunDirs:
    ckpt = recipe.checkpoint.dir
    return RunDirs(checkpoint=ckpt,
                   logs=Path(recipe.logging.dir or (Path(ckpt) / "logs" if ckpt else "runs/logs")),
                   data_cache=recipe.data.cache_dir or str(Path(ckpt or "runs") / "data_cache"))


def parallel_state_and_seeds(recipe, device: torch.device) -> Layout:
    """megatron-core's groups for the recipe's layout, then the seeds (the same on every rank: megatron-core's CUDA
    RNG tracker derives the TP-aware streams from it)."""
    layout = Layout.from_recipe(recipe, torch.distributed.get_world_size())
    groups.build(layout)
    torch.manual_seed(recipe.training.seed)
    if device.type == "cuda":  # megatron-core's CUDA RNG tracker (TP-aware streams) wants its seeds set
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(recipe.training.seed)
    return layout


@dataclass
class TrainData:
    train: MicroBatches
    valid: MicroBatches | None
    plan: list  # the data stages as step spans ([] without stages: recipes.config.stages)
    eval_iters: int  # validation batches per evaluation (0: no validation)


def build_data(recipe, layout: Layout, device: torch.device, total_steps: int, cache_dir: str) -> TrainData:
    """Collective (megatron-core builds the index caches on one rank and the others wait)."""
    from megatron.core import parallel_state

    t = recipe.training
    eval_iters = t.eval_iters if total_steps >= t.eval_interval else 0
    valid_samples = max(eval_iters, 1) * t.global_batch
    plan = stage_plan(recipe)
    if plan:
        train_ds, valid_ds, plan = build_stage_datasets(recipe, valid_samples, cache_dir)
    else:
        train_ds, valid_ds = build_datasets(recipe, total_steps * t.global_batch, valid_samples, cache_dir)
    batches = partial(MicroBatches, micro_batch=layout.micro_batch, grad_accum=layout.grad_accum_steps(t.global_batch),
                      dp_rank=parallel_state.get_data_parallel_rank(), dp_size=layout.dp, device=device,
                      positions=recipe.model.document_mask, num_workers=recipe.data.num_workers)
    return TrainData(train=batches(train_ds), valid=batches(valid_ds) if valid_ds else None, plan=plan,
                     eval_iters=eval_iters)

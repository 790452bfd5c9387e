"""The engine of a run: torch.distributed joined, the optimizer / lr schedule, and `deepspeed.initialize` over the
model this rank holds (its process groups: recipes.train.groups).

One engine kind: DeepSpeed's plain engine over the layers this rank holds. PP = 1: all of them (`PlainDecoder`, ZeRO
0/1/2/3). PP > 1: the layers of this rank's virtual stages (recipes.parallel.pipeline), run by a
torch.distributed.pipelining schedule outside the engine; DeepSpeed's ZeRO-0/1 reduces the gradients over DP and
steps (`groups.PipelineMPU`: its model-parallel group spans TP x PP, so the gradient norm covers every stage).
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from recipes.checkpoint.format import deepspeed_private
from recipes.config.stages import stage_plan, with_stage_lr
from recipes.model.fast_path import any_non_finite, check_attention_backend, compile_decoder_layers
from recipes.parallel.cpu_buffers import place_sequence_parallel_buffers_on_cpu
from recipes.parallel.ds_config import build_ds_config
from recipes.parallel.layout import Layout
from recipes.parallel.rendezvous import STORE_ENV
from recipes.parallel.partition import UNEVEN_GROUPS_FIX, layer_names, rank_layers, uneven_group_problem
from recipes.train import groups


# ---------------------------------------------------------------------------------------------------- distributed
def pick_device(recipe) -> torch.device:
    if recipe.cluster.device == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def init_distributed(recipe) -> torch.device:
    """Join the process group (env:// from torchrun or the deepspeed launcher); gloo on CPU, nccl on GPU."""
    if recipe.cluster.device == "cpu":
        # Name the accelerator instead of letting DeepSpeed guess: its guess warns "Setting accelerator to CPU"
        # once per rank, which is the recipe's choice here, not news.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    device = pick_device(recipe)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(minutes=recipe.training.dist_timeout_minutes)
    if device.type == "cuda":
        # megatron-core's TP linears overlap their all-reduce with the weight-gradient GEMM only when kernels are
        # issued in order on one hardware queue; must be set before the CUDA context exists.
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
        torch.cuda.set_device(device)
    else:
        # DeepSpeed's shared-memory all-reduce is a JIT-built C++ op used only for inference all-reduce; loading it
        # in every CPU rank costs ~30 s on a small machine and training never calls it.
        deepspeed_private.skip_shm_comm_op()
    if not torch.distributed.is_initialized():
        store = os.environ.get(STORE_ENV)  # a local world: a file store, not a TCPStore on every interface
        init = dict(init_method=f"file://{store}", rank=int(os.environ["RANK"]),
                    world_size=int(os.environ["WORLD_SIZE"])) if store else {}
        torch.distributed.init_process_group(backend=backend, timeout=timeout, **init)
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
    _timeout_for_new_groups(timeout)
    return device


def _timeout_for_new_groups(timeout: timedelta) -> None:
    """Every group created from now on waits `timeout`, not torch's default (30 min gloo, 10 min NCCL):
    torch.distributed.new_group does not inherit the default group's timeout. megatron-core's groups get it through
    initialize_model_parallel (recipes.train.groups.build); DeepSpeed's own groups are made with
    deepspeed.comm.new_group(ranks), which takes no timeout, so its backend's new_group is bound to ours."""
    groups.set_group_timeout(timeout)
    deepspeed_private.bind_new_group_timeout(timeout)


def shutdown_distributed() -> None:
    """Leave together: a barrier, then tear the process groups down while the interpreter is fully alive (gloo's
    worker threads still holding work at interpreter exit can abort the process: 'terminate called without an active
    exception')."""
    from megatron.core import parallel_state

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


# ------------------------------------------------------------------------------------------------ optimizer, lr
class GuardedAdamW(torch.optim.AdamW):
    """AdamW (or Adam with weight_decay 0) that skips the update when any rank holds a non-finite gradient.

    DeepSpeed's ZeRO-1/2 optimizers already skip on an invalid grad norm; this covers ZeRO-0/3 too. Every rank calls
    the inner step exactly once per optimizer step, so the world all-reduce of the flag is safe. `last_skipped` tells
    the loop.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_skipped = False
        self.check_finite = True  # off where DeepSpeed's ZeRO-1/2 optimizer already checks the global grad norm

    @torch.no_grad()
    def step(self, closure=None):
        if not self.check_finite:
            return super().step(closure)
        # One fused reduction and one host sync for all gradients (a per-tensor isfinite loop syncs per parameter).
        bad = any_non_finite([p.grad for g in self.param_groups for p in g["params"] if p.grad is not None],
                             self._device())
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        self.last_skipped = bool(bad.item())
        if self.last_skipped:
            return None
        return super().step(closure)

    def _device(self):
        for group in self.param_groups:
            for p in group["params"]:
                return p.device
        return torch.device("cpu")


def build_optimizer(model: torch.nn.Module, recipe, device: torch.device) -> GuardedAdamW:
    """AdamW with decoupled weight decay on matrices only (not on norms, biases); torch's fused kernel on CUDA."""
    o = recipe.training.optimizer
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    wd = o.weight_decay if o.type == "adamw" else 0.0
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    if recipe.model.moe is not None:
        from recipes.train.expert_parallel import build_param_groups

        groups = build_param_groups(groups)  # expert weights in DeepSpeed's MoE groups when parallel.ep > 1
    kwargs = dict(lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    if device.type == "cuda":
        kwargs["fused"] = True
    return GuardedAdamW(groups, **kwargs)  # DeepSpeed drops a group that is empty here (see recipes.parallel.partition)


def lr_multiplier(recipe, total_steps: int):
    """step -> lr / peak lr: linear warmup, then cosine or linear decay to min_lr over decay_steps (then flat); inside a
    data stage with an lr segment, that segment (recipes.config.stages)."""
    s = recipe.training.schedule
    o = recipe.training.optimizer
    warmup = s.warmup_steps
    decay_steps = s.decay_steps or max(1, total_steps - warmup)
    floor = o.min_lr / o.lr

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if s.decay == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / decay_steps)
        if s.decay == "linear":
            return floor + (1.0 - floor) * (1.0 - progress)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return with_stage_lr(stage_plan(recipe), f, o.lr)  # data stages with an lr segment replace it there


# -------------------------------------------------------------------------------------------------------- engine
@dataclass
class Engine:
    engine: object  # deepspeed DeepSpeedEngine over this rank's layers
    module: torch.nn.Module  # those layers (recipes.model.layers.DecoderStack)
    optimizer: GuardedAdamW
    layout: Layout
    device: torch.device
    is_pipe: bool
    ds_config: dict
    attention_backend: str = ""  # the torch SDPA kernel the attention runs on (recipes.model.fast_path)
    pipeline: object = None  # PP > 1: recipes.parallel.pipeline.PipelineRunner (the schedule over this rank's stages)


def _refuse_uneven_stage_groups(recipe, layout) -> None:
    """Raise (on every rank alike, before any collective) when the split gives pipeline ranks different optimizer
    param-group counts: ZeRO-1 would hang in the first step (see recipes.parallel.partition)."""
    m = recipe.model
    held = rank_layers(m, layout.tp, layout.pp, layout.vpp, recipe.parallel.pipeline_partition, layout.ep)
    problem = uneven_group_problem(layer_names(m), held, layout.ep)
    if problem:
        raise ValueError(f"pipeline split gives stages different optimizer param groups ({problem}); "
                         f"{UNEVEN_GROUPS_FIX}")


class _KnownOptimizerFilter(logging.Filter):
    """DeepSpeed calls any optimizer outside its own list "untested" under ZeRO; ours is torch's AdamW plus a
    non-finite check (GuardedAdamW), tested here against plain AdamW, so the warning tells a user nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "untested optimizer" not in record.getMessage()


def _quiet_known_optimizer_warning(ds_logger: logging.Logger) -> None:
    if not any(isinstance(f, _KnownOptimizerFilter) for f in ds_logger.filters):
        ds_logger.addFilter(_KnownOptimizerFilter())


def initialize(recipe, layout: Layout, device: torch.device, total_steps: int) -> Engine:
    """Build model, optimizer and lr schedule and hand them to deepspeed.initialize. parallel_state must be up."""
    import deepspeed
    from megatron.core import parallel_state

    from recipes.model.layers import PlainDecoder

    ds_config = build_ds_config(recipe, layout, device.type)
    if device.type == "cpu" and layout.tp > 1 and (layout.sequence_parallel or recipe.model.mtp is not None):
        place_sequence_parallel_buffers_on_cpu()  # megatron-core's SP / TP gathers (MTP's eh_proj) allocate on CUDA
    attention_backend = check_attention_backend(recipe, device)  # before building: a refusal costs nothing
    is_pipe = layout.pp > 1
    pipe_model = None
    if is_pipe:
        from recipes.parallel.pipeline import build_pipeline_model

        if layout.zero_stage == 1:
            _refuse_uneven_stage_groups(recipe, layout)
        pipe_model = build_pipeline_model(recipe, layout, parallel_state.get_pipeline_model_parallel_rank())
        model = pipe_model.stack
    else:
        model = PlainDecoder(recipe, layout)
    mpu = groups.mpu_for(layout)
    if recipe.model.moe is not None:
        from recipes.train.expert_parallel import mark_for_deepspeed

        mark_for_deepspeed(model, recipe.model.moe.num_experts, layout.ep)
    model.to(device)
    if recipe.training.compile_decoder_layers:
        compile_decoder_layers(model)
    optimizer = build_optimizer(model, recipe, device)
    optimizer.check_finite = layout.zero_stage not in (1, 2)  # ZeRO-1/2 skip on an inf/NaN grad norm themselves
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(recipe, total_steps))
    _quiet_known_optimizer_warning(deepspeed.utils.logger)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, mpu=mpu,
                                      config=ds_config, dist_init_required=False)
    if recipe.model.moe is not None:
        from recipes.train.expert_parallel import after_initialize

        after_initialize(engine, layout)
    pipeline = None
    if is_pipe:
        from recipes.parallel.pipeline import PipelineRunner

        pipeline = PipelineRunner(pipe_model, recipe, layout, device,
                                  layout.grad_accum_steps(recipe.training.global_batch),
                                  pipe_model.stack.loss_fn)  # VocabParallelLoss (recipes.model.mtp's with model.mtp)
    return Engine(engine=engine, module=model, optimizer=optimizer, layout=layout, device=device, is_pipe=is_pipe,
                  ds_config=ds_config, attention_backend=attention_backend, pipeline=pipeline)

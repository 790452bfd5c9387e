"""The DeepSpeed JSON config of a recipe at a layout (batch sizes, ZeRO stage, precision, clipping, recompute).

The optimizer and the lr scheduler are NOT in this dict: `recipes.train.engine` builds them in Python (torch's AdamW, its
fused kernel on GPU; warmup + cosine/linear decay as a LambdaLR) and hands them to deepspeed.initialize,
so one code path serves CPU tests and GPU runs and no DeepSpeed op has to be compiled on CPU.
"""
from __future__ import annotations

from recipes.parallel.layout import Layout


def build_ds_config(recipe, layout: Layout, device_type: str | None = None) -> dict:
    """DeepSpeed config dict for `recipe` run at `layout` (dp must be resolved) on `device_type` ("cuda" / "cpu";
    default: the recipe's cluster.device; the engine passes the device it actually got)."""
    t = recipe.training
    grad_accum = layout.grad_accum_steps(t.global_batch)
    cfg: dict = {
        # DeepSpeed counts every rank of its data axis (DP x CP) as a consumer of micro-batches; the CP ranks of a
        # replica share theirs, so its "batch" is cp x the samples a step really reads (recipes.model.context).
        "train_batch_size": t.global_batch * layout.cp,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": t.grad_clip,
        "steps_per_print": 10**9,  # our loop logs; keep DeepSpeed's own step prints out of the way
        "wall_clock_breakdown": False,
        "zero_optimization": _zero_section(layout, device_type or recipe.cluster.device),
        "zero_allow_untested_optimizer": True,  # torch AdamW on CPU is a plain torch optimizer
        "activation_checkpointing": {
            # Used by deepspeed.checkpointing when recompute == "full"; partitioning over TP needs the mpu.
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        },
    }
    if t.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        cfg["fp16"] = {
            "enabled": True,
            # loss_scale 0 = dynamic; a positive value pins a static scale.
            "loss_scale": float(t.loss_scale or 0.0),
            "initial_scale_power": t.initial_loss_scale_power,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1.0,
        }
    return cfg


def zero_comm_settings(zero_stage: int, device_type: str, pp: int = 1) -> dict:
    """The communication part of DeepSpeed's zero_optimization section: the one source for the JSON we write and for
    the planner's assumptions (`recipes.planner.cost.Assumptions`), so the plan prices the config the trainer runs.

    GPU runs overlap the gradient reduction with the backward on a side stream (overlap_comm) into contiguous
    buffers; CPU/gloo runs keep overlap off: no side streams to overlap on, and the CPU tests' numbers stay as
    measured. A pipeline (pp > 1) keeps it off too: its backward runs in the schedule, outside DeepSpeed's engine, and
    the gradients are reduced once after the last micro-batch (recipes.train.step). Bucket sizes are DeepSpeed's
    defaults.
    """
    if zero_stage == 0:
        return {}
    z = {"reduce_scatter": True, "overlap_comm": device_type == "cuda" and pp == 1, "contiguous_gradients": True,
         "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}
    if zero_stage == 3:
        z["stage3_prefetch_bucket_size"] = 5e7
    return z


def _zero_section(layout: Layout, device_type: str) -> dict:
    z: dict = {"stage": layout.zero_stage}
    z.update(zero_comm_settings(layout.zero_stage, device_type, layout.pp))
    if layout.zero_stage == 3:
        z.update({"stage3_param_persistence_threshold": 0, "stage3_gather_16bit_weights_on_model_save": False})
    return z

"""Every DeepSpeed internal this project leans on, in one module: names with a leading underscore, module globals
and classes DeepSpeed does not document as API. Each function says what it relies on;
tests/recipes/test_deepspeed_private.py pins that behaviour, so a DeepSpeed upgrade that changes one of them fails
one test named after it instead of an export, a reshape or a resume somewhere else. Tested with DeepSpeed 0.19.8.
"""
from __future__ import annotations

import contextlib
import io
from collections import OrderedDict
from datetime import timedelta
from types import SimpleNamespace

import torch


def _silently(fn, *args):
    # zero_to_fp32 prints (stdout) and shows tqdm bars (stderr) of its own
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args)


# ------------------------------------------------------------------------------------ ZeRO partitions (zero_to_fp32)
def zero2_merge(flat_groups: list[list[torch.Tensor]], param_shapes: list[dict],
                alignment_paddings: list[list[int]] | None = None) -> "OrderedDict[str, torch.Tensor]":
    """ZeRO-1/2: name -> full tensor from every DP rank's flat fp32 partitions (`flat_groups[dp][group]`), packed in
    `param_shapes` order (one {name: shape} per param group). Relies on zero_to_fp32._zero2_merge_trainable_params
    (state_dict, world_size, fp32_flat_groups, zero_model_states, param_alignment_paddings) reading only
    `param_shapes` of zero_model_states[0]; the same packing holds the Adam moments."""
    from deepspeed.utils import zero_to_fp32 as z

    merged: OrderedDict = OrderedDict()
    _silently(z._zero2_merge_trainable_params, merged, len(flat_groups), flat_groups,
              [SimpleNamespace(param_shapes=param_shapes)], alignment_paddings)
    return merged


def zero3_merge(flat_groups: list[list[torch.Tensor]], param_shapes: list[dict]) -> "OrderedDict[str, torch.Tensor]":
    """ZeRO-3: name -> full tensor from every DP rank's flat fp32 groups (each parameter split evenly over the DP ranks,
    padded at its end). Relies on zero_to_fp32._zero3_merge_trainable_params(state_dict, world_size,
    fp32_flat_groups, zero_model_states) filling lazy tensors whose `.contiguous()` gathers them."""
    from deepspeed.utils import zero_to_fp32 as z

    merged: OrderedDict = OrderedDict()
    _silently(z._zero3_merge_trainable_params, merged, len(flat_groups), flat_groups,
              [SimpleNamespace(param_shapes=param_shapes)])
    return OrderedDict((k, v.contiguous()) for k, v in merged.items())


# ----------------------------------------------------------------------------------- ZeRO-1/2 optimizer of an engine
def zero_optimizer(engine_optimizer):
    """DeepSpeed's ZeRO-1/2 optimizer (it keeps `single_partition_of_fp32_groups`), or None (ZeRO-0/3)."""
    return engine_optimizer if hasattr(engine_optimizer, "single_partition_of_fp32_groups") else None


def link_optimizer_state(zero) -> None:
    """ZeRO-1/2 create Adam's state lazily at the first step. After the caller put a state (step, exp_avg,
    exp_avg_sq) for each flat fp32 partition into `zero.optimizer.state`, link every parameter's fragment to it, so
    that deepspeed.utils.safe_set_full_optimizer_state writes into it. Relies on
    DeepSpeedZeroOptimizer._lazy_init_hp_params_optimizer_state()."""
    zero._lazy_init_hp_params_optimizer_state()


def fragment_address(numel: int, start: int):
    """The per-parameter entry of a ZeRO-1/2 optimizer file's `param_slice_mappings` (deepspeed.utils.tensor_fragment
    .fragment_address, a dataclass of numel and start)."""
    from deepspeed.utils.tensor_fragment import fragment_address as address

    return address(numel=numel, start=start)


def zero_stage_enum(stage: int):
    """The `zero_stage` value a ZeRO-1/2 optimizer file records (deepspeed.runtime.zero.config.ZeroStageEnum)."""
    from deepspeed.runtime.zero.config import ZeroStageEnum

    return ZeroStageEnum.gradients if stage == 2 else ZeroStageEnum.optimizer_states


# ------------------------------------------------------------------------------------------- pipeline, process groups
def reduce_pipeline_gradients(engine) -> None:
    """After a pipeline schedule ran every micro-batch's backward outside the engine (in `engine.no_sync()`): reduce
    the accumulated gradients over DP as DeepSpeed's own pipeline engine did after its schedule. ZeRO-1 relies on
    DeepSpeedZeroOptimizer.reduce_gradients(pipeline_parallel=True), which sets up the contiguous reduction buffer
    that a backward through the engine would have set up (with pipeline_parallel=False it is missing when the
    schedule computed the weight gradients apart, as zero-bubble does: tested); ZeRO-0 uses the public
    `allreduce_gradients`."""
    optimizer = engine.optimizer
    if zero_optimizer(optimizer) is not None and hasattr(optimizer, "reduce_gradients"):
        optimizer.set_gradient_accumulation_boundary(True)
        optimizer.reduce_gradients(pipeline_parallel=True)
    else:
        engine.allreduce_gradients()


def bind_new_group_timeout(timeout: timedelta) -> None:
    """DeepSpeed makes its pipeline / topology / tied-weight groups with deepspeed.comm.new_group(ranks), which takes
    no timeout (torch's default then applies: 30 min gloo, 10 min NCCL); bind its backend's new_group to `timeout`.
    Relies on deepspeed.comm.comm.cdb (the backend object, set by deepspeed.init_distributed) and on new_group
    calling `cdb.new_group(ranks)`."""
    import deepspeed.comm.comm as ds_comm

    if ds_comm.cdb is not None:
        ds_comm.cdb.new_group = lambda ranks: torch.distributed.new_group(ranks, timeout=timeout)


def skip_shm_comm_op() -> None:
    """Do not build DeepSpeed's shared-memory all-reduce op (a JIT-compiled C++ op for inference all-reduce on CPU,
    ~30 s per rank on a small machine, never used by training). Relies on deepspeed.comm.torch.build_shm_op
    skipping the op when deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] is False."""
    import deepspeed
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False

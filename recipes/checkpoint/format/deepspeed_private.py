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


# ------------------------------------------------------------------------------------------- expert parallelism (MoE)
def register_expert_groups(name: str, ep_group, edp_group) -> None:
    """Put this rank's expert-parallel (EP) and expert-data-parallel (EDP) groups into DeepSpeed's group registry under
    `name` (DeepSpeed's "ep_size_<ep>"), as deepspeed.utils.groups._create_expert_and_data_parallel would have made
    them: ZeRO then partitions and reduces the expert parameters over these ranks. Relies on the module globals
    groups._EXPERT_PARALLEL_GROUP(_RANKS) and groups._EXPERT_DATA_PARALLEL_GROUP(_RANKS), dicts keyed by group name,
    which DeepSpeed's own getters read."""
    from deepspeed.utils import groups

    groups._EXPERT_PARALLEL_GROUP[name] = ep_group
    groups._EXPERT_PARALLEL_GROUP_RANKS[name] = torch.distributed.get_process_group_ranks(ep_group)
    groups._EXPERT_DATA_PARALLEL_GROUP[name] = edp_group
    groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = torch.distributed.get_process_group_ranks(edp_group)


def expert_groups_registered(name: str) -> bool:
    """Whether DeepSpeed's group registry holds expert groups named `name`. Relies on
    groups._get_expert_parallel_group_dict()."""
    from deepspeed.utils import groups

    return name in groups._get_expert_parallel_group_dict()


def moe_marker(num_experts: int, ep: int, group_name: str) -> torch.nn.Module:
    """A parameter-free module whose class derives from `deepspeed.moe.layer.MoE`: DeepSpeed's engine decides that a
    model has expert-parallel parameters (`has_moe_layers`: ZeRO partitions the MoE param groups over the expert-data-
    parallel group named by the parameters' `group_name`) by finding an instance of that class among the model's
    modules, and calls its `set_deepspeed_parallelism`. Relies on the engine reading only `num_experts` of it and on
    MoE.__init__ being skippable (it would build DeepSpeed's own gate and experts): nn.Module.__init__ instead."""
    from deepspeed.moe.layer import MoE

    class DeepSpeedMoEMarker(MoE):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.num_experts, self.ep_size, self.num_local_experts = num_experts, ep, num_experts // ep
            self.expert_group_name = group_name

        def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
            if not expert_groups_registered(self.expert_group_name):
                raise RuntimeError(f"DeepSpeed has no expert groups '{self.expert_group_name}': register megatron-"
                                   "core's with recipes.train.groups.build (register_expert_groups) before "
                                   "deepspeed.initialize")

        def forward(self, *args, **kwargs):
            raise RuntimeError("DeepSpeedMoEMarker has no forward: it only marks the model for DeepSpeed")

    return DeepSpeedMoEMarker()


def save_as_dense_model(engine) -> None:
    """From now on the engine saves and loads the files of a dense model although ZeRO was built for MoE param groups
    (DeepSpeed's MoE checkpoint layout expects its own MoE module names). Relies on the engine's `has_moe_layers`,
    set by deepspeed.initialize, being read again only by save_checkpoint / load_checkpoint (and the MoE gradient
    path of its own backward, which ZeRO-1/2 replace)."""
    engine.has_moe_layers = False


def run_after_each_load(engine, after) -> None:
    """Call `after(engine)` whenever `engine.load_checkpoint` has loaded (its result unchanged), whoever calls it.
    Relies on DeepSpeed's callers and ours reaching the load through the instance attribute `load_checkpoint`."""
    load = engine.load_checkpoint

    def load_then_after(*args, **kwargs):
        result = load(*args, **kwargs)
        after(engine)
        return result

    engine.load_checkpoint = load_then_after


def module_weights_from_masters(engine) -> None:
    """ZeRO-1/2: the module weights <- this rank's fp32 masters, gathered over each param group's own DP group (the
    EDP group for experts). Relies on DeepSpeedZeroOptimizer.update_lp_params(); a no-op for other optimizers."""
    optimizer = engine.optimizer
    if hasattr(optimizer, "update_lp_params"):
        optimizer.update_lp_params()


# ------------------------------------------------------------------------------------------------- engine's own state
def set_progress(engine, steps: int, samples: int) -> None:
    """The engine's step and sample counters, as its own load_checkpoint sets them from a checkpoint (after a
    reshard on load, which installs the state without it). Relies on DeepSpeedEngine.global_steps / global_samples
    being plain attributes that its lr-schedule, logging and save code read."""
    engine.global_steps, engine.global_samples = steps, samples


def swap_checkpoint_engine(engine, make):
    """Put `make(current)` in place of the engine's checkpoint engine (the object that writes and reads every file of
    save_checkpoint / load_checkpoint) and return it. Relies on DeepSpeedEngine keeping it in the attribute
    `checkpoint_engine` and calling its save / load / create / commit (deepspeed.runtime.checkpoint_engine)."""
    engine.checkpoint_engine = make(engine.checkpoint_engine)
    return engine.checkpoint_engine

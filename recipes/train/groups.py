"""Every process group of a run, built once from the layout (recipes.parallel.layout.Layout: the dimensions, their
rules and the rank order) and checked against it.

`build(layout)` makes megatron-core's groups (TP, CP, DP, DP x CP, PP, model-parallel, and with parallel.ep the
expert-parallel and expert-data-parallel groups) with `layout.megatron_order`, hands the expert groups to DeepSpeed's
registry under DeepSpeed's name for them (so ZeRO shards and reduces the experts over exactly the ranks megatron-core
dispatches tokens over), and then checks that each group this rank got holds the ranks `Layout.coords` says it
should (`group_mismatches`): the order is encoded once, in Layout, and a library that read it otherwise stops the
run here instead of training on crossed groups. DeepSpeed sees the same groups through the `mpu` adapters below;
our pipeline schedules, context-parallel attention and MoE dispatch read them from megatron-core's registry.
"""
from __future__ import annotations

from datetime import timedelta

import torch

from recipes.checkpoint.format import deepspeed_private
from recipes.parallel.layout import Layout

_GROUP_TIMEOUT: timedelta | None = None


def set_group_timeout(timeout: timedelta) -> None:
    """The recipe's collective timeout for every group `build` makes (torch's default otherwise: new_group does not
    inherit the default group's)."""
    global _GROUP_TIMEOUT
    _GROUP_TIMEOUT = timeout


def expert_group_name(ep: int) -> str:
    return f"ep_size_{ep}"  # DeepSpeed's name for the groups of expert-parallel size ep


def build(layout: Layout) -> None:
    """This rank's groups for `layout` (collective: every rank calls it), checked against the layout's rank order."""
    from megatron.core import parallel_state

    world = torch.distributed.get_world_size()
    if world != layout.world_size:
        raise RuntimeError(f"world size {world} != TP x CP x PP x DP = {layout.describe()}; start "
                           f"{layout.world_size} processes or change parallel.tp/cp/pp/dp")
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    minutes = {} if _GROUP_TIMEOUT is None else {
        "distributed_timeout_minutes": max(1, round(_GROUP_TIMEOUT.total_seconds() / 60))}
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp, expert_model_parallel_size=layout.ep, order=layout.megatron_order,
        create_gloo_process_groups=False, **minutes)  # the default backend is gloo on CPU already; NCCL runs need none
    bad = group_mismatches(layout, torch.distributed.get_rank(), _groups_of_this_rank(layout))
    if bad:
        raise RuntimeError("megatron-core's process groups do not follow the layout's rank order "
                           f"({layout.megatron_order}): " + "; ".join(bad))
    if layout.ep > 1:
        deepspeed_private.register_expert_groups(expert_group_name(layout.ep),
                                                 parallel_state.get_expert_model_parallel_group(),
                                                 parallel_state.get_expert_data_parallel_group())


def expected_groups(layout: Layout, rank: int) -> dict[str, list[int]]:
    """The ranks of each of `rank`'s groups, from `Layout.coords` / `Layout.rank` / `Layout.expert_coords` alone."""
    c = layout.coords(rank)

    def along(dim: str) -> list[int]:
        return [layout.rank(**{**c, dim: i}) for i in range(getattr(layout, dim))]

    data_axis = sorted(layout.rank(**{**c, "dp": d, "cp": k}) for d in range(layout.dp) for k in range(layout.cp))
    out = {"tp": along("tp"), "cp": along("cp"), "dp": along("dp"), "pp": along("pp"), "dp_cp": data_axis}
    if layout.ep > 1:
        e = layout.expert_coords(rank)
        out["ep"] = [r for r in data_axis if layout.expert_coords(r)["edp"] == e["edp"]]
        out["edp"] = [r for r in data_axis if layout.expert_coords(r)["ep"] == e["ep"]]
    return out


def group_mismatches(layout: Layout, rank: int, got: dict[str, list[int]]) -> list[str]:
    """Each group in `got` (name -> its ranks) that is not the one `expected_groups` gives, said with both."""
    want = expected_groups(layout, rank)
    return [f"rank {rank}'s {name} group is {sorted(ranks)}, the layout's is {want[name]}"
            for name, ranks in got.items() if sorted(ranks) != want[name]]


def _groups_of_this_rank(layout: Layout) -> dict[str, list[int]]:
    from megatron.core import parallel_state as ps

    ranks = torch.distributed.get_process_group_ranks
    got = {"tp": ranks(ps.get_tensor_model_parallel_group()), "cp": ranks(ps.get_context_parallel_group()),
           "dp": ranks(ps.get_data_parallel_group()), "pp": ranks(ps.get_pipeline_model_parallel_group()),
           "dp_cp": ranks(ps.get_data_parallel_group(with_context_parallel=True))}
    if layout.ep > 1:
        got["ep"] = ranks(ps.get_expert_model_parallel_group())
        got["edp"] = ranks(ps.get_expert_data_parallel_group())
    return got


class MegatronMPU:
    """The `mpu` object DeepSpeed asks for, over megatron-core's groups: "model parallel" = TP (PP = 1 path), so ZeRO
    shards optimizer state and gradients over the data-parallel group only; "data parallel" = DP x CP (megatron-core's
    `with_context_parallel` groups): CP ranks hold the same parameters and their gradients are reduced like DP's
    (recipes.model.context)."""

    def __init__(self):
        from megatron.core import parallel_state as ps

        self.ps = ps

    def get_model_parallel_rank(self):
        return self.ps.get_tensor_model_parallel_rank()

    def get_model_parallel_world_size(self):
        return self.ps.get_tensor_model_parallel_world_size()

    def get_model_parallel_group(self):
        return self.ps.get_tensor_model_parallel_group()

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_tensor_model_parallel_src_rank(self):
        return self.ps.get_tensor_model_parallel_src_rank()

    def get_data_parallel_rank(self):
        return self.ps.get_data_parallel_rank(with_context_parallel=True)

    def get_data_parallel_world_size(self):
        return self.ps.get_data_parallel_world_size(with_context_parallel=True)

    def get_data_parallel_group(self):
        return self.ps.get_data_parallel_group(with_context_parallel=True)

    def get_data_parallel_group_ranks(self):
        return torch.distributed.get_process_group_ranks(self.get_data_parallel_group())

    def get_pipeline_model_parallel_rank(self):
        return self.ps.get_pipeline_model_parallel_rank()

    def get_pipeline_model_parallel_world_size(self):
        return self.ps.get_pipeline_model_parallel_world_size()

    def get_pipeline_model_parallel_group(self):
        return self.ps.get_pipeline_model_parallel_group()


class PipelineMPU(MegatronMPU):
    """The mpu of a pipeline (PP > 1) run: "model parallel" = TP x PP (megatron-core's model-parallel group), so ZeRO
    sums the gradient norm over every stage and every TP rank; its rank, stage x TP + TP rank, names the checkpoint
    files (`mp_rank_MM`, as DeepSpeed's own pipeline grid named them). "tensor model parallel" stays TP: ZeRO counts
    a replicated parameter (a norm) on TP rank 0 only."""

    def get_model_parallel_rank(self):
        return (self.ps.get_pipeline_model_parallel_rank() * self.ps.get_tensor_model_parallel_world_size()
                + self.ps.get_tensor_model_parallel_rank())

    def get_model_parallel_world_size(self):
        return self.ps.get_tensor_model_parallel_world_size() * self.ps.get_pipeline_model_parallel_world_size()

    def get_model_parallel_group(self):
        return self.ps.get_model_parallel_group()


def mpu_for(layout: Layout) -> MegatronMPU:
    return PipelineMPU() if layout.pp > 1 else MegatronMPU()

"""What the project relies on in DeepSpeed's internals, pinned: every function of
recipes/checkpoint/format/deepspeed_private.py against a result built by hand (the flat ZeRO packings) or against
DeepSpeed's own public calls (a ZeRO-1 engine in a world of one). A DeepSpeed upgrade that changes one of them
fails here, by name, before an export, reshape or resume fails somewhere less clear."""
from __future__ import annotations

import os
from collections import OrderedDict
from datetime import timedelta

import pytest
import torch

from recipes.checkpoint.format import deepspeed_private as dsp

pytestmark = pytest.mark.unit


def test_zero2_merge_unflattens_dp_partitions_in_param_shapes_order():
    a, b, c = torch.arange(6.).view(2, 3), torch.arange(10., 14.), torch.arange(20., 23.)
    dp = 2
    # DeepSpeed's ZeRO-1/2 packing: a group's parameters back to back, padded to a multiple of 2 x DP, cut in DP parts
    g0 = torch.cat([a.flatten(), b, torch.zeros(2)])  # 10 -> 12
    g1 = torch.cat([c, torch.zeros(1)])  # 3 -> 4
    flat = [[g0[:6], g1[:2]], [g0[6:], g1[2:]]]  # [dp rank][group]
    shapes = [OrderedDict(a=torch.Size([2, 3]), b=torch.Size([4])), OrderedDict(c=torch.Size([3]))]
    merged = dsp.zero2_merge(flat, shapes)
    assert list(merged) == ["a", "b", "c"]
    for name, want in (("a", a), ("b", b), ("c", c)):
        assert torch.equal(merged[name], want)
    assert len(flat) == dp


def test_zero3_merge_gathers_each_parameter_split_over_dp():
    a, b = torch.arange(5.), torch.arange(10., 14.).view(2, 2)
    # ZeRO-3: each parameter split evenly over the DP ranks (padded at its end); a rank's flat group is its parts
    rank0 = torch.cat([a[:3], b.flatten()[:2]])
    rank1 = torch.cat([a[3:], torch.zeros(1), b.flatten()[2:]])
    merged = dsp.zero3_merge([[rank0], [rank1]], [OrderedDict(a=torch.Size([5]), b=torch.Size([2, 2]))])
    assert torch.equal(merged["a"], a) and torch.equal(merged["b"], b)


def test_optimizer_file_values():
    from deepspeed.runtime.zero.config import ZeroStageEnum

    assert dsp.zero_stage_enum(1) == ZeroStageEnum.optimizer_states and int(dsp.zero_stage_enum(1)) == 1
    assert dsp.zero_stage_enum(2) == ZeroStageEnum.gradients and int(dsp.zero_stage_enum(2)) == 2
    address = dsp.fragment_address(numel=7, start=3)
    assert (address.numel, address.start) == (7, 3)


@pytest.fixture(scope="module")
def world_of_one():
    """torch.distributed and deepspeed.comm over gloo in this process (torn down if made here)."""
    import deepspeed
    import deepspeed.comm.comm as ds_comm

    made = not torch.distributed.is_initialized()
    if made:
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    had_backend = ds_comm.cdb is not None
    set_local_rank = "LOCAL_RANK" not in os.environ  # what a launcher sets; DeepSpeed's engines read it
    os.environ.setdefault("LOCAL_RANK", "0")
    dsp.skip_shm_comm_op()
    deepspeed.init_distributed(dist_backend="gloo", dist_init_required=False)
    yield
    if set_local_rank:
        del os.environ["LOCAL_RANK"]
    if not had_backend:
        ds_comm.cdb = None
    if made:
        torch.distributed.destroy_process_group()


def test_skip_shm_comm_op_keeps_deepspeed_from_building_it(world_of_one):
    import deepspeed
    from deepspeed.comm.torch import build_shm_op
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    assert deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] is False
    assert build_shm_op() is None


def test_new_groups_get_the_bound_timeout(world_of_one):
    import deepspeed.comm as dist
    import deepspeed.comm.comm as ds_comm

    dsp.bind_new_group_timeout(timedelta(seconds=77))
    try:
        group = dist.new_group([0])
        assert group._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=77)
    finally:
        del ds_comm.cdb.new_group  # the backend's own method again


def test_reduce_pipeline_gradients_then_step_is_adamw_on_the_outside_backward(world_of_one):
    """A backward run outside the engine (as a pipeline schedule runs it, inside no_sync), then the reduction
    DeepSpeed's pipeline engine ran after its schedule, then the engine's step: torch's AdamW step exactly."""
    import copy

    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    reference, initial = copy.deepcopy(model), copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, dist_init_required=False, config={
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True})
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    x = torch.randn(2, 4)
    engine.set_gradient_accumulation_boundary(False)
    with engine.no_sync():
        for i in range(2):  # two micro-batches, each loss / 2 as the schedule's loss function divides
            (model(x[i:i + 1]).square().sum() / 2).backward()
    engine.set_gradient_accumulation_boundary(True)
    dsp.reduce_pipeline_gradients(engine)
    engine.step()
    (reference(x).square().sum() / 2).backward()
    ref_opt.step()
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert not any(torch.equal(a, b) for a, b in zip(model.parameters(), initial.parameters()))  # it stepped


def test_link_optimizer_state_lets_public_setters_fill_zero_partitions(world_of_one):
    import deepspeed
    from deepspeed.utils import safe_get_full_optimizer_state, safe_set_full_optimizer_state

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, dist_init_required=False, config={
        "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}})
    zero = dsp.zero_optimizer(engine.optimizer)
    assert zero is not None and dsp.zero_optimizer(opt) is None
    for flat in zero.single_partition_of_fp32_groups:
        zero.optimizer.state[flat] = {"step": torch.tensor(3.0), "exp_avg": torch.zeros_like(flat),
                                      "exp_avg_sq": torch.zeros_like(flat)}
    dsp.link_optimizer_state(zero)
    weight = model[1].weight
    value = torch.arange(float(weight.numel())).view_as(weight) + 1
    safe_set_full_optimizer_state(weight, value, "exp_avg")
    assert torch.equal(safe_get_full_optimizer_state(weight, "exp_avg"), value)
    filled = sum(int((zero.optimizer.state[f]["exp_avg"] != 0).sum()) for f in zero.single_partition_of_fp32_groups)
    assert filled == weight.numel()  # written into the flat partition the optimizer steps with


def test_no_other_module_reaches_into_deepspeed():
    """The wrapper is the one place: the private names it wraps are used nowhere else in recipes/."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "recipes"
    private = re.compile(r"\._zero[23]_merge|(import|from) [\w.]*zero_to_fp32|zero_to_fp32 import|"
                         r"\._lazy_init_hp_params_optimizer_state|\.reduce_gradients\(|\.cdb\b|__compatible_ops__")
    wrapper = root / "checkpoint" / "format" / "deepspeed_private.py"
    assert private.search(wrapper.read_text())  # the pattern finds the uses where they are
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in root.rglob("*.py") if p != wrapper
             for m in private.finditer(p.read_text())]
    assert found == [], found

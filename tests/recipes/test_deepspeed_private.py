"""What the project relies on in DeepSpeed's internals, pinned: every function of
recipes/checkpoint/format/deepspeed_private.py against a result built by hand (the flat ZeRO packings) or against
DeepSpeed's own public calls (a ZeRO-1 engine in a world of one). A DeepSpeed upgrade that changes one of them
fails here, by name, before an export, reshape or resume fails somewhere less clear. And the wrapper is the one
place: an AST scan of the product finds no DeepSpeed internal anywhere else (and finds planted ones)."""
from __future__ import annotations

import os
from collections import OrderedDict
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from recipes.checkpoint.format import deepspeed_private as dsp
from tests.support import deepspeed_scan

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
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert not any(torch.equal(a, b) for a, b in zip(model.parameters(), initial.parameters(), strict=True))


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


@pytest.fixture
def expert_groups_of_one(world_of_one):
    """DeepSpeed's expert groups "ep_size_1" registered (a world of one: EP = EDP = rank 0), removed afterwards."""
    from deepspeed.utils import groups

    group = torch.distributed.new_group([0])
    dsp.register_expert_groups("ep_size_1", group, group)
    yield group
    for registry in (groups._EXPERT_PARALLEL_GROUP, groups._EXPERT_PARALLEL_GROUP_RANKS,
                     groups._EXPERT_DATA_PARALLEL_GROUP, groups._EXPERT_DATA_PARALLEL_GROUP_RANKS):
        registry.pop("ep_size_1", None)


def test_registered_expert_groups_are_the_ones_deepspeed_reads(expert_groups_of_one):
    from deepspeed.utils import groups

    group = expert_groups_of_one
    assert dsp.expert_groups_registered("ep_size_1") and not dsp.expert_groups_registered("ep_size_7")
    assert groups._get_expert_parallel_group("ep_size_1") is group
    assert groups._get_expert_data_parallel_group("ep_size_1") is group
    assert groups._get_expert_parallel_group_ranks("ep_size_1") == [0]
    assert groups._get_expert_data_parallel_group_ranks("ep_size_1") == [0]


class _ExpertModel(torch.nn.Module):
    """A dense linear and an "expert" linear carrying DeepSpeed's MoE parameter attributes, with the marker."""

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(4, 4)
        self.expert = torch.nn.Linear(4, 4, bias=False)
        self.expert.weight.allreduce, self.expert.weight.group_name = False, "ep_size_1"
        self.marker = dsp.moe_marker(num_experts=2, ep=1, group_name="ep_size_1")

    def forward(self, x):
        return self.expert(self.dense(x))


def test_moe_marker_dense_files_and_refresh_after_each_load(expert_groups_of_one, tmp_path):
    """The marker makes the engine build ZeRO for experts (their param group partitioned over the registered EDP
    group); `save_as_dense_model` makes it save a dense model's files; `run_after_each_load` runs after every load;
    `module_weights_from_masters` puts the fp32 masters back into the module."""
    import deepspeed

    from recipes.checkpoint import safe_load
    from recipes.train.expert_parallel import build_param_groups

    torch.manual_seed(0)
    model = _ExpertModel()
    param_groups = build_param_groups([{"params": [model.dense.weight, model.expert.weight], "weight_decay": 0.1},
                                       {"params": [model.dense.bias], "weight_decay": 0.0}])
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(param_groups, lr=1e-2),
                                      dist_init_required=False, config={
                                          "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                                          "zero_allow_untested_optimizer": True})
    assert engine.has_moe_layers and engine.num_experts == [2]
    moe = [i for i, g in enumerate(engine.optimizer.optimizer.param_groups) if g.get("moe")]
    assert len(moe) == 1 and engine.optimizer.real_dp_process_group[moe[0]] is expert_groups_of_one
    with pytest.raises(RuntimeError, match="no forward"):
        model.marker(torch.zeros(1))

    dsp.save_as_dense_model(engine)
    loads = []
    dsp.run_after_each_load(engine, loads.append)
    engine.backward(engine(torch.randn(2, 4)).square().sum())
    engine.step()
    engine.save_checkpoint(str(tmp_path), tag="t")
    saved = safe_load.load(tmp_path / "t" / "mp_rank_00_model_states.pt")
    assert "num_experts" not in saved and "ds_autoep_layers" not in saved  # what DeepSpeed's MoE save writes
    assert set(saved["module"]) == {"dense.weight", "dense.bias", "expert.weight"}
    path, _ = engine.load_checkpoint(str(tmp_path), tag="t")
    assert path.endswith("mp_rank_00_model_states.pt") and loads == [engine]

    master = dsp.zero_optimizer(engine.optimizer).single_partition_of_fp32_groups[moe[0]].clone()
    with torch.no_grad():
        model.expert.weight.zero_()
    dsp.module_weights_from_masters(engine)
    assert torch.equal(model.expert.weight.detach().flatten(), master[:model.expert.weight.numel()])


def test_moe_marker_refuses_unregistered_groups(world_of_one):
    marker = dsp.moe_marker(num_experts=4, ep=2, group_name="ep_size_2")
    with pytest.raises(RuntimeError, match="no expert groups 'ep_size_2'.*register_expert_groups"):
        marker.set_deepspeed_parallelism()


def test_progress_and_checkpoint_engine_are_what_save_checkpoint_uses(world_of_one, tmp_path):
    import deepspeed

    from recipes.checkpoint import safe_load

    model = torch.nn.Linear(3, 2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                      dist_init_required=False, config={
                                          "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                                          "zero_allow_untested_optimizer": True})
    dsp.set_progress(engine, steps=7, samples=56)
    written = []

    class Recording(type(engine.checkpoint_engine)):
        def save(self, state_dict, path):
            written.append(os.path.basename(path))
            return super().save(state_dict, path)

    made = dsp.swap_checkpoint_engine(engine, lambda current: Recording(config_params=None))
    assert engine.checkpoint_engine is made
    engine.save_checkpoint(str(tmp_path), tag="t")
    assert sorted(written) == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    saved = safe_load.load(tmp_path / "t" / "mp_rank_00_model_states.pt")
    assert (saved["global_steps"], saved["global_samples"]) == (7, 56)


# ------------------------------------------------------------------------------------- the wrapper is the one place
REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "recipes" / "checkpoint" / "format" / "deepspeed_private.py"


def test_no_other_module_uses_deepspeed_internals():
    """An AST scan of the product (recipes, launch, data_prep) for private DeepSpeed names, DeepSpeed state written,
    DeepSpeed classes subclassed without their __init__ (tests/support/deepspeed_scan.py): only the wrapper has any."""
    found = [str(f) for package in ("recipes", "launch", "data_prep")
             for f in deepspeed_scan.scan_tree(REPO / package, skip={WRAPPER})]
    assert found == [], "DeepSpeed internals outside the wrapper (deepspeed_private.py):\n" + "\n".join(found)


def test_the_scan_sees_every_internal_the_wrapper_uses():
    found = {(f.kind, f.what) for f in deepspeed_scan.scan_source(WRAPPER.read_text(), "wrapper")}
    for kind, what in [("private", "z._zero2_merge_trainable_params"), ("private", "z._zero3_merge_trainable_params"),
                       ("private", "DeepSpeed engine/optimizer internal zero._lazy_init_hp_params_optimizer_state"),
                       ("writes", "DeepSpeed's state: ds_comm.cdb.new_group"),
                       ("private", "deepspeed.ops.__compatible_ops__"),
                       ("writes", "DeepSpeed's state: groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name]"),
                       ("private", "groups._get_expert_parallel_group_dict"),
                       ("subclass", "class DeepSpeedMoEMarker(MoE) skips its base's __init__"),
                       ("writes", "a DeepSpeed engine/optimizer attribute: engine.has_moe_layers"),
                       ("writes", "a DeepSpeed engine/optimizer attribute: engine.load_checkpoint"),
                       ("writes", "a DeepSpeed engine/optimizer attribute: engine.global_steps"),
                       ("writes", "a DeepSpeed engine/optimizer attribute: engine.checkpoint_engine")]:
        assert (kind, what) in found, (kind, what, sorted(found))


PLANTED = """\
import deepspeed
from deepspeed.utils import groups
from deepspeed.utils.groups import _get_expert_parallel_group
from deepspeed.moe.layer import MoE
import deepspeed.comm.comm as ds_comm


def register(g, engine, opt, layers):
    groups._EXPERT_PARALLEL_GROUP["ep_size_2"] = g
    ds_comm.cdb = None
    setattr(deepspeed.ops, "x", 1)
    engine.has_moe_layers = False
    engine.load_checkpoint = lambda *a: None
    opt._lazy_init_hp_params_optimizer_state()
    return groups._get_expert_parallel_group_dict()


class Marker(MoE):
    def __init__(self):
        object.__init__(self)


class Fine(MoE):
    def __init__(self):
        super().__init__(hidden_size=4, expert=None)


def not_deepspeed(groups, self):
    groups[0] = 1  # a parameter named like the module: not DeepSpeed's
    self.has_moe_layers = False  # an object's own attribute
    monitor = None
    monitor.tqdm_cls.monitor = None  # a plain word DeepSpeed also uses
"""


def test_the_scan_catches_planted_internals():
    found = [(f.line, f.kind) for f in deepspeed_scan.scan_source(PLANTED, "planted.py")]
    assert sorted(set(found)) == [(3, "private"), (9, "private"), (9, "writes"), (10, "writes"), (11, "writes"),
                                  (12, "writes"), (13, "writes"), (14, "private"), (15, "private"),
                                  (18, "subclass")], found

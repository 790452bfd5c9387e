"""The checkpoints a launch would load, checked before anything starts (`validate_for_launch`, the messages asserted):
checkpoint.dir saved at another layout than the launch's (resharded on load, recipes.checkpoint.reshard; refused only
where that cannot be done, with the exact `recipes reshape` command or the resume that can; the command is parsed by
the real `recipes reshape` parser here), checkpoint.dir holding another model, and a checkpoint.init_from that is
missing or does not fit the model. The tags are complete.json records as the trainer
writes them (tests/support/checkpoints.py). Proof that no rank exists when these fire:
tests/recipes/test_validation_prespawn.py and tests/launch/test_launch_refusals.py."""
import pytest

from recipes.config.loading import load_recipe
from recipes.planner.validation import validate_for_launch
from tests.recipes.test_validation_launch import write_manifest
from tests.support.checkpoints import recorded_tag

pytestmark = pytest.mark.unit

TINY = "configs/runs/tiny-cpu.yaml"  # tp 1, pp 1, ZeRO-1, seq 64


def found(tmp_path, ckpt, *overrides, world=1):
    data = write_manifest(tmp_path / "data")
    recipe = load_recipe(TINY, [f"data.manifests=[{data}]", f"checkpoint.dir={ckpt}", *overrides])
    return validate_for_launch(recipe, world)


def test_a_relaunch_at_the_saved_layout_is_accepted(tmp_path):
    recorded_tag(tmp_path / "ck", TINY, "parallel.tp=2", world=2)
    assert found(tmp_path, tmp_path / "ck", "parallel.tp=2", world=2) == []
    # CP holds no parameters and DeepSpeed's data axis is DP x CP: CP=2 x DP=1 files are CP=1 x DP=2 files
    recorded_tag(tmp_path / "cp", TINY, "parallel.cp=2", world=2)
    assert found(tmp_path, tmp_path / "cp", world=2) == []
    # ZeRO-0 partitions nothing over DP: fewer (or more) data-parallel ranks load the same files
    recorded_tag(tmp_path / "z0", TINY, "parallel.zero_stage=0", world=4)
    assert found(tmp_path, tmp_path / "z0", "parallel.zero_stage=0", world=2) == []
    assert found(tmp_path, tmp_path / "z0", "parallel.zero_stage=0", world=8) == []
    [p] = found(tmp_path, tmp_path / "z0", world=2)  # but not into ZeRO-1, which partitions the optimizer over DP
    assert "ZeRO-1 (saved ZeRO-0)" in p.message


def test_a_relaunch_at_another_layout_is_resharded_on_load(tmp_path):
    ck = tmp_path / "ck"
    recorded_tag(ck, TINY, "parallel.tp=2", world=2)
    assert found(tmp_path, ck, world=2) == []  # TP=1 x DP=2 over a TP=2 checkpoint: `recipes train` reshards it
    assert found(tmp_path, ck, "parallel.pp=2", "parallel.vpp=2", world=4) == []
    assert found(tmp_path, ck, "parallel.tp=2", "parallel.zero_stage=2", world=2) == []  # ZeRO-1 -> ZeRO-2 too
    [p] = found(tmp_path, ck, "parallel.zero_stage=3", world=2)  # ZeRO-3 partitions are not filled tensor by tensor
    assert p.field == "parallel" and "resharding on load fills ZeRO-0/1/2 engines" in p.message
    assert p.fix.startswith("resume at parallel.zero_stage=2 (`recipes train` reshards it on load)")


MOE = ["model.moe.num_experts=4", "model.moe.top_k=2"]


def test_experts_split_over_ep_ranks_are_resharded_on_load_and_zero0_sources_refused_with_the_fix(tmp_path):
    ck = tmp_path / "ck"
    recorded_tag(ck, TINY, *MOE, "parallel.ep=2", world=2)
    assert found(tmp_path, ck, *MOE, "parallel.tp=2", world=2) == []  # TP=2 x EP=1 over an EP=2 x DP=2 one
    z0 = tmp_path / "z0"
    recorded_tag(z0, TINY, "parallel.zero_stage=0", world=2)
    [p] = found(tmp_path, z0, "parallel.tp=2", world=2)
    assert p.field == "parallel" and "a ZeRO-0 checkpoint's optimizer state cannot be resharded" in p.message
    assert p.fix.startswith("a ZeRO-0 checkpoint's optimizer state cannot be re-laid") and \
        f"checkpoint.init_from={z0}" in p.fix


def test_a_relaunch_of_another_model_is_refused_naming_both(tmp_path):
    ck = tmp_path / "ck"
    recorded_tag(ck, TINY)
    [p] = found(tmp_path, ck, "model.hidden_size=128", "model.num_layers=2")
    assert p.field == "model.num_layers"
    assert p.message == (f"checkpoint.dir = {ck} holds global_step4 of another model (model.num_layers=4, "
                         "model.hidden_size=64); this recipe has model.num_layers=2, model.hidden_size=128: its "
                         "weights do not fit this model")


def test_a_relaunch_at_another_sequence_length_points_to_init_from(tmp_path):
    ck = tmp_path / "ck"
    recorded_tag(ck, TINY)
    [p] = found(tmp_path, ck, "model.seq_length=256")
    assert p.field == "model.seq_length"
    assert p.fix == (f"resume with model.seq_length=64; for a stage at 256 tokens start a new run from this one: "
                     f"checkpoint.dir=NEW_DIR checkpoint.init_from={ck}")


def test_init_from_refusals_name_the_field_and_the_fix(tmp_path):
    src = tmp_path / "src"
    recorded_tag(src, TINY, "parallel.tp=2", world=2, step=3)
    new = tmp_path / "new"
    assert found(tmp_path, new, f"checkpoint.init_from={src}", "model.seq_length=256", "parallel.cp=2",
                 world=2) == []
    [p] = found(tmp_path, new, f"checkpoint.init_from={tmp_path / 'gone'}")
    assert p.field == "checkpoint.init_from.dir" and str(tmp_path / "gone") in p.message
    [p] = found(tmp_path, new, f"checkpoint.init_from.dir={src}", "checkpoint.init_from.tag=global_step9")
    assert p.field == "checkpoint.init_from.dir" and "global_step9" in p.message
    [p] = found(tmp_path, new, f"checkpoint.init_from={src}", "model.hidden_size=128")
    assert str(p) == (f"checkpoint.init_from: {src / 'global_step3'} holds a model with model.hidden_size=64; this "
                      "recipe has model.hidden_size=128: its weights do not fit this model; set model.hidden_size=64 "
                      "(the source's), or start from a checkpoint of this model")
    [p] = found(tmp_path, new, f"checkpoint.init_from={src}", "model.num_query_groups=4")
    assert p.field == "model.num_query_groups"
    [p] = found(tmp_path, new, f"checkpoint.init_from={src}", "parallel.zero_stage=3")
    assert p.field == "parallel.zero_stage"
    [p] = found(tmp_path, src, f"checkpoint.init_from={src}", "checkpoint.auto_resume=false")
    assert p.field == "checkpoint.init_from.dir" and "is this run's own checkpoint.dir" in p.message
    zero0 = tmp_path / "zero0"
    recorded_tag(zero0, TINY, "parallel.zero_stage=0")
    [p] = found(tmp_path, new, f"checkpoint.init_from.dir={zero0}", "checkpoint.init_from.optimizer=true")
    assert p.field == "checkpoint.init_from.optimizer"
    assert found(tmp_path, new, f"checkpoint.init_from.dir={zero0}") == []  # its weights alone are fine


def test_resume_wins_over_init_from(tmp_path):
    """checkpoint.dir holds this run's own checkpoint: the run resumes it; init_from (here missing) is not read."""
    own = tmp_path / "own"
    recorded_tag(own, TINY)
    assert found(tmp_path, own, f"checkpoint.init_from={tmp_path / 'gone'}") == []


def test_init_from_shorthand():
    recipe = load_recipe(TINY, ["checkpoint.init_from=/runs/short"])
    assert recipe.checkpoint.init_from.model_dump() == {"dir": "/runs/short", "tag": None, "optimizer": False}

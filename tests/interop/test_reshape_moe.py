"""Reshape of a mixture-of-experts checkpoint across expert parallelism: EP2 -> EP1 -> EP4.

One source run: the MoE recipe of tests/training/test_moe_training.py (4 experts, top-2, MoE and dense layers, a
gated shared expert, aux and z losses) at EP=2 inside DP=4 (4 ranks, "EP2 x DP2": each expert on 2 expert-data-
parallel ranks; ZeRO-1), 5 steps, saved at step 3 and at the end. Reference: its own uninterrupted steps 4 and 5.
The step-3 checkpoint is reshaped to EP=1 x DP=2 (2 ranks, every rank holds all experts) and resumed for steps 4..5;
the EP1 checkpoint is reshaped again to EP=4 x DP=4 (one expert per rank) and resumed. Both must give the
reference's losses (rel <= 1e-5, the tolerance of the EP layouts against one process in test_moe_training.py): the
layouts differ only in the order of floating-point additions (at DP=2 each rank accumulates 4 micro-batches, at DP=4
two, before the all-reduce; observed 8e-8 at EP1 x DP2 and 0.0 at EP4 x DP4). A lost or misplaced moment (an
expert's moments handed to another expert), a reset Adam step, a wrong lr position or a re-read data position moves
the loss by far more.

The moments are also compared bit for bit across readers: the EP1 x TP1 target is read offline from its DeepSpeed
files (recipes.checkpoint.format.read), the EP2 source by engines at its layout (recipes.train.state_reader).
"""
from __future__ import annotations

import shutil

import pytest
import torch

from interop_runs import RECIPE, Run, run_overrides
from recipes.checkpoint.format.layout_record import saved_layout
from recipes.checkpoint.format.read import read_full_state
from recipes.checkpoint.recipe_file import load_checkpoint_recipe
from recipes.config.loading import RecipeError
from recipes.tools.reshape import main as reshape_main, parse_target, reshape
from tests.support.engine_read import read_by_engines
from tests.support.runs import losses, pretrain, recipes_cli

pytestmark = pytest.mark.multiproc

REL_TOL = 1e-5
MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.layer_pattern=[1,1,0,1]",
       "model.moe.shared_expert_ffn_size=64", "model.moe.shared_expert_gate=true", "model.moe.aux_loss_coeff=0.01",
       "model.moe.z_loss_coeff=0.001"]
SAVED = "global_step3"


@pytest.fixture(scope="module")
def moe_ep2(tmp_path_factory, corpus) -> Run:
    run_dir = tmp_path_factory.mktemp("moe_ep2")
    overrides = run_overrides(corpus, run_dir) + MOE + ["parallel.ep=2", "training.train_steps=5",
                                                          "checkpoint.save_interval=3", "checkpoint.keep_last=2"]
    pretrain(4, *overrides, timeout=400)
    return Run(run_dir, RECIPE, overrides)


def _reshape(source, out, target: str, tag: str = SAVED) -> None:
    """`python -m recipes reshape` (the source's stored recipe; its engine reader and writer ranks forked from the
    command's pre-imported process: recipes.train.local_workers)."""
    proc = recipes_cli(["reshape", "--checkpoint", str(source), "--tag", tag, "--out", str(out), "--to", target,
                        "--quiet"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def ep1(moe_ep2, tmp_path_factory):
    out = tmp_path_factory.mktemp("moe_reshape") / "ep1_dp2"
    _reshape(moe_ep2.path, out, "tp=1,pp=1,dp=2,ep=1")
    return out


def _resume(n: int, source: Run, ckpt, ep: int, tmp_path) -> dict:
    run_dir = tmp_path / "resumed"
    shutil.copytree(ckpt, run_dir)  # the resumed run saves into its checkpoint.dir; keep the reshaped one as it is
    pretrain(n, *source.overrides, f"checkpoint.dir={run_dir}", f"parallel.ep={ep}", timeout=400)
    return losses(run_dir)


def _assert_continues(got: dict, ref: dict, name: str) -> None:
    assert sorted(got) == [4, 5], f"{name}: the reshaped run did not resume at step 4: {got}"
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
    print(f"{name}: losses {got} vs uninterrupted EP2 (DP4) {ref}: worst rel. diff {worst:.1e}")
    assert worst <= REL_TOL, f"{name}: losses after reshape {got} vs uninterrupted {ref} (worst rel. {worst:.2e})"


def test_ep2_to_ep1_carries_the_optimizer_state(moe_ep2, ep1, tmp_path):
    before = read_by_engines(moe_ep2.path, SAVED, tmp_path / "source_state")
    after = read_full_state(ep1, moe_ep2.recipe().model, with_moments=True)  # EP1 x TP1: offline, every name known
    assert sorted(after.weights) == sorted(before["weights"])
    experts = [n for n in before["weights"] if n.endswith("mlp.experts.linear_fc1.weight")]
    assert experts and all(before["exp_avg_sq"][n][e].abs().sum() > 0 for n in experts for e in range(4))  # real
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        a, b = before[part], getattr(after, part)
        bad = [n for n in a if not torch.equal(a[n], b[n])]
        assert not bad, f"{part} differ after reshape: {bad[:4]}"
    assert after.meta["optimizer_step"] == before["meta"]["optimizer_step"] == 3
    assert after.meta["client_state"]["consumed_samples"] == before["meta"]["client_state"]["consumed_samples"] == 24


def test_ep2_to_ep1_continues_with_the_same_losses(moe_ep2, ep1, tmp_path):
    _assert_continues(_resume(2, moe_ep2, ep1, 1, tmp_path), losses(moe_ep2.path), "EP2 (DP4) -> EP1 x DP2")


def test_ep1_to_ep4_continues_with_the_same_losses(moe_ep2, ep1, tmp_path):
    assert load_checkpoint_recipe(str(ep1), None, []).parallel.ep == 1  # the recipe the reshape stored
    ep4 = tmp_path / "ep4_dp4"
    _reshape(ep1, ep4, "tp=1,pp=1,dp=4,ep=4")
    _assert_continues(_resume(4, moe_ep2, ep4, 4, tmp_path), losses(moe_ep2.path), "EP2 (DP4) -> EP1 x DP2 -> EP4 x DP4")


@pytest.mark.parametrize("target,field", [("tp=1,pp=1,dp=3,ep=3", "num_experts=4 is not divisible by parallel.ep=3"),
                                          ("tp=1,pp=1,dp=2,ep=4", "parallel.ep=4 does not divide")])
def test_impossible_expert_layouts_refused(moe_ep2, tmp_path, capsys, target, field):
    out = tmp_path / "never"
    code = reshape_main(["--checkpoint", str(moe_ep2.path), "--tag", SAVED, "--out", str(out), "--to", target,
                         "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and field in err and err.count("\n") == 0, err
    assert not out.exists()


def test_stream_writer_refused_for_experts(moe_ep2, tmp_path):
    with pytest.raises(RecipeError, match="experts.*--writer engine"):
        reshape(str(moe_ep2.path), str(tmp_path / "never"), moe_ep2.recipe(), parse_target("tp=1,pp=1,dp=2,ep=1"),
                tag=SAVED, quiet=True, writer="stream")


def test_init_from_an_ep1_tp2_source_into_an_ep2_run(moe_ep2, ep1, tmp_path):
    """checkpoint.init_from of a MoE source saved at EP=1 (here TP=2: a reshape of the EP1 checkpoint, so the
    experts' TP shards are joined by the offline reader the ranks use) into a run at EP=2 x DP=4: the new run's step-0
    checkpoint holds the EP1 checkpoint's weights and moments bit for bit (both read offline, the step-0 checkpoint
    after a reshape back to EP1: the reader of the first test)."""
    tp2 = tmp_path / "tp2_ep1"
    _reshape(ep1, tp2, "tp=2,pp=1,dp=1,ep=1")
    stage = tmp_path / "stage_ep2"
    pretrain(4, *moe_ep2.overrides, f"checkpoint.dir={stage}", f"checkpoint.init_from.dir={tp2}",
             "checkpoint.init_from.optimizer=true", "training.train_steps=1", timeout=400)
    assert sorted(losses(stage)) == [1] and saved_layout(stage / "global_step0").ep == 2
    _reshape(stage, tmp_path / "stage_ep1", "tp=1,pp=1,dp=2,ep=1", tag="global_step0")
    model = moe_ep2.recipe().model
    ref = read_full_state(ep1, model, with_moments=True)
    got = read_full_state(tmp_path / "stage_ep1", model, with_moments=True)
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        a, b = getattr(ref, part), getattr(got, part)
        bad = [n for n in a if not torch.equal(a[n], b[n])]
        assert list(b) == list(a) and not bad, f"{part} differ: {bad[:4]}"
    assert got.meta["optimizer_step"] == ref.meta["optimizer_step"] == 3


def test_init_from_an_ep2_source_into_an_ep1_run(moe_ep2, ep1, tmp_path):
    """checkpoint.init_from of a source saved at EP=2 (each rank reads its experts from the source's expert-data-
    parallel partitions) into a run at EP=1 x DP=2: nothing refused before launch, and the new run's step-0 checkpoint
    holds the source's weights and moments bit for bit (compared with the offline reshape of the source to EP=1)."""
    from recipes.checkpoint.init_from import init_from_refusals
    from recipes.config.loading import load_recipe

    stage = tmp_path / "stage_ep1"
    overrides = [o for o in moe_ep2.overrides if o != "parallel.ep=2"] + [
        "parallel.ep=1", f"checkpoint.dir={stage}", f"checkpoint.init_from.dir={moe_ep2.path}",
        f"checkpoint.init_from.tag={SAVED}", "checkpoint.init_from.optimizer=true", "training.train_steps=1"]
    assert not [r for r in init_from_refusals(load_recipe(RECIPE, overrides)) if r.field == "checkpoint.init_from"]
    pretrain(2, *overrides, timeout=400)
    assert sorted(losses(stage)) == [1] and saved_layout(stage / "global_step0").ep == 1
    model = moe_ep2.recipe().model
    ref = read_full_state(ep1, model, with_moments=True)
    got = read_full_state(stage, model, tag="global_step0", with_moments=True)
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        a, b = getattr(ref, part), getattr(got, part)
        bad = [n for n in a if not torch.equal(a[n], b[n])]
        assert list(b) == list(a) and not bad, f"{part} differ: {bad[:4]}"

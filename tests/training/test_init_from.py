"""checkpoint.init_from: a long-context stage started from a short-context run's checkpoint at another layout, and the
relaunch of a checkpoint.dir at another layout refused with the reshape command that then works.

Source: the tiny recipe at seq 64, TP=2 (2 ranks, ZeRO-1), 3 steps. Stage: the same model at seq 256, CP=2 (2 ranks,
TP=1, ZeRO-1: each rank holds chunks i and 3-i of 64 tokens), started from the source's latest tag.

Reference computed another way: the source's weights read offline (recipes.checkpoint.format.read, not the streaming
reader init_from uses for ZeRO-1/2) into a 1-process PlainDecoder (TP = CP = 1), fed the stage's first global batch
as megatron-core's GPTDataset gives it at seq 256 (samples 0-7: every layout reads the same samples per step,
recipes.train.data), its loss taken by torch's cross entropy over all tokens. The stage's first loss is computed
before any update, so it must equal this up to the order of additions (CP's gathered attention, the loss reduced
over CP ranks): tolerance 1e-5 relative; observed 0. Weights carried wrong (a TP shard in the wrong place, the
vocabulary padded wrongly, a layer skipped) move it by far more.
The carried state is shown by the stage's own step-0 checkpoint (saved when it starts, before any step): its weights
and, when asked, its Adam moments and step count equal the source's exactly.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from recipes.checkpoint.format.read import read_full_state
from recipes.config.loading import load_recipe
from tests.support.runs import RECIPE, losses, pretrain, recipes_cli, worker_env

pytestmark = pytest.mark.multiproc

REL_TOL = 1e-5
STAGE = ["model.seq_length=256", "parallel.cp=2"]


@pytest.fixture(scope="module")
def source(corpus, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("seq64_tp2")
    pretrain(2, f"data.manifests=[{corpus}]", f"checkpoint.dir={run_dir}", "parallel.tp=2",
             "training.train_steps=3", timeout=600)
    assert (run_dir / "latest").read_text().strip() == "global_step3"
    return run_dir


@pytest.fixture(scope="module")
def direct_first_loss(source, corpus, tmp_path_factory, single_process_group) -> float:
    """The source model's loss on the stage's first global batch, in one process."""
    from tests.support.plain_model import build_plain_model, logits
    from recipes.train.data import build_datasets, collate

    recipe = load_recipe(RECIPE, [f"data.manifests=[{corpus}]", *STAGE, "training.train_steps=2"])
    model = build_plain_model(recipe, read_full_state(source, recipe.model).weights)
    gb = recipe.training.global_batch
    train, _ = build_datasets(recipe, 2 * gb, gb, str(tmp_path_factory.mktemp("cache")))
    tokens, (labels, mask) = collate([train[i] for i in range(gb)], positions=False)
    assert tokens.shape == (gb, 256)
    out = logits(model, tokens, recipe.model.vocab_size)
    ce = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1), reduction="none")
    return float((ce * mask.reshape(-1)).sum() / mask.sum())


def _marker(tag_dir: Path) -> dict:
    return json.loads((tag_dir / "complete.json").read_text())


def _first_loss_matches(stage: Path, direct: float, name: str) -> None:
    first = losses(stage)[1]
    rel = abs(first - direct) / abs(direct)
    print(f"{name}: first loss {first!r}, source model directly {direct!r}, relative difference {rel:.1e}")  # -rP
    assert rel <= REL_TOL, (first, direct)


def test_long_context_stage_starts_from_the_source_weights(source, corpus, direct_first_loss, tmp_path):
    stage = tmp_path / "seq256_cp2"
    run = [f"data.manifests=[{corpus}]", f"checkpoint.dir={stage}", *STAGE, f"checkpoint.init_from={source}"]
    out = pretrain(2, *run, "training.train_steps=2", timeout=600)
    assert f"initialised from {source}/global_step3 (step 3 of tiny-cpu): its weights at this run's layout" \
        in out.stderr
    _first_loss_matches(stage, direct_first_loss, "init_from weights, seq 64 TP2 -> seq 256 CP2")
    assert sorted(losses(stage)) == [1, 2]  # the step starts at zero

    # the starting point holds the source's weights exactly (at TP=1: its TP=2 shards joined, vocabulary re-padded)
    model_cfg = load_recipe(RECIPE, STAGE).model
    ref, got = read_full_state(source, model_cfg).weights, read_full_state(stage, model_cfg, tag="global_step0").weights
    assert sorted(got) == sorted(ref) and all(torch.equal(got[k], ref[k]) for k in ref)

    # consumed samples from zero; the source recorded in every new checkpoint; the new layout recorded
    src = _marker(source / "global_step3")
    for tag, step in (("global_step0", 0), ("global_step2", 2)):
        m = _marker(stage / tag)
        assert m["client_state"]["step"] == step and m["client_state"]["consumed_samples"] == 8 * step
        assert m["client_state"]["init_from"] == {
            "dir": str(source.resolve()), "tag": "global_step3", "step": 3, "layout": {
                "tp": 2, "cp": 1, "pp": 1, "vpp": 1, "dp": 1, "ep": 1, "zero_stage": 1, "padded_vocab_size": 512,
                "seq_length": 64}, "recipe": src["recipe"], "optimizer": False}
        assert m["layout"] == {"tp": 1, "cp": 2, "pp": 1, "vpp": 1, "dp": 1, "ep": 1, "zero_stage": 1,
                               "padded_vocab_size": 384, "seq_length": 256, "world_size": 2, "schedule": "1f1b",
                               "format": 2}
    # weights only: fresh moments, Adam's step count from zero
    assert read_full_state(stage, model_cfg, with_moments=True).meta["optimizer_step"] == 2

    # run again over its own checkpoints: resume wins over init_from, and says so
    again = pretrain(2, *run, "training.train_steps=3", timeout=600)
    log = again.stdout + again.stderr
    assert f"checkpoint.dir {stage} holds this run's own checkpoint (step 2): resuming it; checkpoint.init_from " \
           f"({source}) is not read again" in log
    assert f"resumed from {stage / 'global_step2'}" in log and "initialised from" not in log
    assert sorted(losses(stage)) == [1, 2, 3]


def test_optimizer_state_carried_when_asked(source, corpus, direct_first_loss, tmp_path):
    stage = tmp_path / "seq256_cp2_opt"
    pretrain(2, f"data.manifests=[{corpus}]", f"checkpoint.dir={stage}", *STAGE, f"checkpoint.init_from.dir={source}",
             "checkpoint.init_from.optimizer=true", "training.train_steps=1", timeout=600)
    _first_loss_matches(stage, direct_first_loss, "init_from weights + optimizer")
    model_cfg = load_recipe(RECIPE, STAGE).model
    ref = read_full_state(source, model_cfg, with_moments=True)
    got = read_full_state(stage, model_cfg, tag="global_step0", with_moments=True)
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        a, b = getattr(ref, part), getattr(got, part)
        assert sorted(b) == sorted(a) and all(torch.equal(b[k], a[k]) for k in a), part
        assert any(t.abs().sum() > 0 for t in b.values()), part  # real moments, not zeros
    assert got.meta["optimizer_step"] == ref.meta["optimizer_step"] == 3  # Adam's bias correction continues
    assert _marker(stage / "global_step0")["client_state"]["init_from"]["optimizer"] is True
    assert read_full_state(stage, model_cfg, tag="global_step1", with_moments=True).meta["optimizer_step"] == 4


def test_relaunch_at_another_layout_reshards_on_load(source, corpus, tmp_path):
    """The source (TP=2) relaunched on 2 ranks at TP=1 x DP=2 is accepted before launch and resharded on load: its
    tag only read, the next step's loss that of resuming it at TP=2."""
    import hashlib
    import shutil

    from recipes.planner.validation import validate_for_launch

    runs = {name: tmp_path / name for name in ("tp1dp2", "tp2")}
    for d in runs.values():
        shutil.copytree(source, d)
    digest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (source / "global_step3").iterdir()}
    common = [f"data.manifests=[{corpus}]", "training.train_steps=4"]
    assert validate_for_launch(load_recipe(RECIPE, [*common, f"checkpoint.dir={runs['tp1dp2']}"]), 2) == []
    out = pretrain(2, *common, f"checkpoint.dir={runs['tp1dp2']}", timeout=600)
    assert "resharding it on load" in out.stdout + out.stderr
    pretrain(2, *common, f"checkpoint.dir={runs['tp2']}", "parallel.tp=2", timeout=600)  # loaded by DeepSpeed
    got, ref = losses(runs["tp1dp2"])[4], losses(runs["tp2"])[4]
    assert abs(got - ref) <= 1e-5 * ref, (got, ref)
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (runs["tp1dp2"] / "global_step3").iterdir()
            } == digest  # the source tag only read

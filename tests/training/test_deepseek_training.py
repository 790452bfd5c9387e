"""DeepSeek-V3-class training on CPU ranks against the 1-process run of the same recipe: the tiny DeepSeek-V3-shaped
recipe (configs/runs/tiny-deepseek-cpu.yaml: multi-head latent attention, a dense first layer, sigmoid routing over
expert groups with routed scaling, a shared expert, the sequence-level aux loss, aux-loss-free balancing at a bias
rate of 0.01 so that the bias moves routing within a few steps, one multi-token-prediction depth with its own MoE
layer), with document masking (per-token RoPE positions and attention within documents reach MLA and the depth), at

  EP2 x DP2;
  TP2 x EP2 x PP2 with interleaved stages (vpp 2) and full recompute: MLA's heads split over TP, the depth and its
  copy of the embedding on the last stage;
  TP2 with sequence parallelism x CP2: MLA's down-projections on each rank's slice of the tokens, its keys and values
  gathered over CP, the aux losses' CP shares;

all with the same losses, depth losses, routing and biases; and an EP2 x DP2 run killed after step 5 resumes its
biases bitwise.

Tolerance as tests/training/test_training_layouts.py: fp32, layouts change only the order of additions (observed
~1e-7 relative), 1e-5 allowed; a down-projection summed over TP twice, a RoPE key whose gradient is not summed over
TP, a head split in the wrong place, a bias update over the wrong group or an aux loss scaled wrongly under CP (the
CP shares were averaged: 4.6e-4 by step 8) moves the loss by far more, and routing differs.
"""
from __future__ import annotations

import subprocess

import pytest
import torch

from recipes.checkpoint import safe_load
from tests.support.runs import (REPO, kill_group, losses, on_corpus, pretrain, pretrain_cmd, train_records,
                                wait_for_step, worker_env)

pytestmark = pytest.mark.multiproc

REL_TOL = 1e-5


def _rel(a, b):
    return abs(a - b) / abs(b)


DEEPSEEK_RECIPE = str(REPO / "configs/runs/tiny-deepseek-cpu.yaml")
DS_STEPS = 8
DEEPSEEK = [f"training.train_steps={DS_STEPS}", "model.moe.bias_update_rate=0.01", "model.document_mask=true",
            "checkpoint.save_interval=2", "checkpoint.keep_last=4"]


def _deepseek(n, run_dir, corpus, *overrides):
    pretrain(n, *on_corpus(run_dir, corpus), *DEEPSEEK, *overrides, config=DEEPSEEK_RECIPE, timeout=400)
    return {r["step"]: r for r in train_records(run_dir)}


@pytest.fixture(scope="module")
def deepseek_reference(short_doc_corpus, tmp_path_factory):
    return _deepseek(1, tmp_path_factory.mktemp("ds_ref"), short_doc_corpus)


@pytest.fixture(scope="module")
def deepseek_ep2(short_doc_corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ds_ep2")
    return run_dir, _deepseek(4, run_dir, short_doc_corpus, "parallel.ep=2")


def _assert_same_deepseek_training(got: dict, ref: dict, name: str) -> None:
    assert sorted(got) == sorted(ref) == list(range(1, DS_STEPS + 1))
    worst = max(_rel(got[s]["loss"], ref[s]["loss"]) for s in ref)
    assert worst <= REL_TOL, f"{name}: losses {[got[s]['loss'] for s in got]} vs {[ref[s]['loss'] for s in ref]}"
    for key in ("grad_norm", "moe_aux_loss"):
        worst = max(_rel(got[s][key], ref[s][key]) for s in ref)
        assert worst <= 10 * REL_TOL, f"{name}: {key} {[got[s][key] for s in got]} vs {[ref[s][key] for s in ref]}"
    mtp, ref_mtp = [got[s]["mtp_loss"][0] for s in ref], [ref[s]["mtp_loss"][0] for s in ref]
    assert max(_rel(a, b) for a, b in zip(mtp, ref_mtp)) <= REL_TOL, f"{name}: mtp_loss {mtp} vs {ref_mtp}"
    for s in ref:  # the same routing, hence the same bias steps (sums of +-0.01: equal as floats)
        assert got[s]["moe_tokens_per_expert"] == ref[s]["moe_tokens_per_expert"], (name, s)
        assert got[s]["moe_expert_bias"] == ref[s]["moe_expert_bias"], (name, s)
    assert len(ref[1]["moe_tokens_per_expert"]) == 4  # layers 2-4 (the first is dense) and the MTP depth's
    assert ref[DS_STEPS]["mtp_loss"][0] < ref[1]["mtp_loss"][0] - 0.3  # the depth learns to predict 2 tokens ahead
    assert any(b != 0 for layer in ref[DS_STEPS]["moe_expert_bias"] for b in layer)
    assert all(sum(t) == 8 * 64 * 2 for t in ref[1]["moe_tokens_per_expert"])  # every token to its top-2
    assert ref[DS_STEPS]["loss"] < ref[1]["loss"] - 0.5  # and the model learns


def test_deepseek_routing_at_ep2_dp2_matches_single_process(deepseek_ep2, deepseek_reference):
    _assert_same_deepseek_training(deepseek_ep2[1], deepseek_reference, "ep2-dp2")


# Micro-batches of 2: half the micro-batches (on 2 cores each one's collectives cost more than its compute); the global
# batch, hence the reference, is the same, and the pipeline still runs whole interleaved rounds (2 per DP rank, PP 2).
LAYOUTS = {"tp2-ep2-pp2-vpp2-recompute": (8, ["parallel.tp=2", "parallel.ep=2", "parallel.pp=2", "parallel.vpp=2",
                                              "parallel.recompute=full", "parallel.micro_batch=2"]),
           "tp2-sp-cp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.cp=2",
                              "parallel.micro_batch=2"])}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_deepseek_layout_matches_single_process(name, deepseek_reference, short_doc_corpus, tmp_path):
    n, overrides = LAYOUTS[name]
    got = _deepseek(n, tmp_path, short_doc_corpus, *overrides)
    _assert_same_deepseek_training(got, deepseek_reference, name)


def _expert_biases(tag_dir) -> dict:
    """name -> expert_bias tensor of every model-parallel rank's module states in a checkpoint tag."""
    out = {}
    for path in sorted(tag_dir.glob("mp_rank_*_model_states.pt")):
        for name, t in safe_load.load(path)["module"].items():
            if name.endswith("router.expert_bias"):
                out[f"{path.name}:{name}"] = t
    return out


def test_killed_deepseek_run_resumes_its_expert_biases_bitwise(deepseek_ep2, short_doc_corpus, tmp_path):
    """EP2 x DP2, SIGKILL after step 5 (saved at step 4), auto-resume: the biases come back from the checkpoint's
    module states (fp32), so steps 5-8 route, and lose, exactly as the uninterrupted run's."""
    ref_dir, ref = deepseek_ep2
    cmd = pretrain_cmd(4, *on_corpus(tmp_path, short_doc_corpus), *DEEPSEEK, "parallel.ep=2",
                       "checkpoint.async_save=false", config=DEEPSEEK_RECIPE)
    proc = subprocess.Popen(cmd, cwd=REPO, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for_step(tmp_path / "logs" / "metrics.jsonl", 5, proc)
    finally:
        kill_group(proc)
    assert max(losses(tmp_path)) < DS_STEPS
    resumed = pretrain(4, *on_corpus(tmp_path, short_doc_corpus), *DEEPSEEK, "parallel.ep=2", config=DEEPSEEK_RECIPE)
    assert "resumed from" in resumed.stdout + resumed.stderr
    got = {r["step"]: r for r in train_records(tmp_path)}  # the resumed run's records win
    assert [got[s]["loss"] for s in ref] == [ref[s]["loss"] for s in ref]
    assert [got[s]["moe_expert_bias"] for s in ref] == [ref[s]["moe_expert_bias"] for s in ref]
    tag = f"global_step{DS_STEPS}"
    mine, theirs = _expert_biases(tmp_path / tag), _expert_biases(ref_dir / tag)
    assert sorted(mine) == sorted(theirs) and len(mine) == 4  # one file (no PP, no TP), layers 2-4 and the depth
    assert all(t.dtype == torch.float32 and torch.equal(t, theirs[k]) for k, t in mine.items())


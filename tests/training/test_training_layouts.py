"""TP x PP x DP layouts give the same per-step losses as TP=1 x PP=1 x DP=1 with the same recipe and global batch.

Full activation recompute (ZeRO-2 and PP=4 cases) changes no result, so it is exercised here too, and the validation
losses (pipeline engine's eval_batch vs the plain engine) are compared with the same tolerance.

Why they can be compared at all: the full initial weights do not depend on the layout (CPU initialisation, one seed
per pipeline layer, padded vocabulary rows masked out of the loss), every layout sees the same samples in each step
(consumed-sample addressing), and the loss is the mean over the same micro-batches of one size.

Tolerance: fp32 on CPU. Splitting a matmul over TP ranks or summing gradients over DP ranks changes only the order of
floating-point additions, which moves results by a few ulps (~1e-7 relative) per operation; over 6 Adam steps we see
at most ~1e-7 relative differences in the loss. We allow 2e-5 relative: 100x the observed noise, yet far below what a
real wiring error does (a missing all-reduce, a shard in the wrong place, wrong data order or a double-counted gradient
changes the loss by >1e-3 from the first steps on).
"""
from __future__ import annotations

import math

import pytest

from recipes.checkpoint import safe_load
from recipes.config.loading import load_recipe
from recipes.parallel.partition import stage_boundaries
from tests.support.observed import (ObservedRuns, collectives, elements_on, layout_dims, mesh_group,
                                    params_numel)
from tests.support.reference_curves import assert_follows_pinned
from tests.support.runs import on_corpus, RECIPE, REPO, losses, pretrain, train_records, val_losses

pytestmark = pytest.mark.multiproc

STEPS = 6
REL_TOL = 2e-5


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref_1x1x1")
    pretrain(1, *on_corpus(run_dir, corpus), f"training.train_steps={STEPS}", "training.eval_interval=3")
    return run_dir


LAYOUTS = {
    "tp2-pp2-dp2-zero1": (8, ["parallel.tp=2", "parallel.pp=2", "parallel.zero_stage=1"]),
    "tp2-dp2-zero2": (4, ["parallel.tp=2", "parallel.zero_stage=2", "parallel.recompute=full"]),
    "tp2-dp2-zero3": (4, ["parallel.tp=2", "parallel.zero_stage=3"]),
    "tp1-pp4-dp2-zero1": (8, ["parallel.pp=4", "parallel.zero_stage=1", "parallel.recompute=full",
                              "parallel.pipeline_partition=parameters"]),  # the default split is tested below
}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """Each layout trained once, observed from inside its ranks (tests/support/observed.py)."""
    def make(name, run_dir, observe):
        n, overrides = LAYOUTS[name]
        pretrain(n, *on_corpus(run_dir, corpus), f"training.train_steps={STEPS}", "training.eval_interval=3",
                 *overrides, timeout=400, observe=observe)

    return ObservedRuns(tmp_path_factory, make)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name, reference, runs):
    run_dir = runs(name).run_dir
    ref, got = losses(reference), losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    assert worst <= REL_TOL, f"{name}: per-step losses {got} vs 1x1x1 {ref} (worst relative difference {worst:.2e})"
    ref_val, got_val = val_losses(reference), val_losses(run_dir)  # validation through the same engine path
    assert sorted(got_val) == sorted(ref_val) == [3, 6]
    assert all(abs(got_val[s] - ref_val[s]) <= REL_TOL * ref_val[s] for s in ref_val), (got_val, ref_val)


def assert_zero_partitions(name: str, ranks: list[dict], d: dict) -> None:
    """ZeRO >= 1 on each rank: Adam's state (and the fp32 masters) for 1/dp of the rank's parameters, the DP group's
    shares adding up to all of them (DeepSpeed pads each flat group a little). Without it every rank keeps them all."""
    for e in ranks:
        dp_group = mesh_group(e["rank"], "dp", d["mesh"])
        params, opt = params_numel(e), e["optimizer"]
        shares = [ranks[r]["optimizer"]["exp_avg_numel"] for r in dp_group]
        assert params <= sum(shares) <= params * 1.01 + 64 * d["dp"] and max(shares) - min(shares) <= 64, (
            f"{name} rank {e['rank']}: Adam state of {opt['exp_avg_numel']:,} elements for {params:,} parameters, "
            f"the DP group {dp_group} holds {shares}: ZeRO-{d['zero']} does not partition the optimizer state")
        assert opt["masters_numel"] == opt["exp_avg_numel"], (name, e["rank"], opt)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero_stage_is_on(name, runs):
    """DeepSpeed at ZeRO-0 instead would give the same losses. What each stage changes, per rank:
    ZeRO-1: the optimizer state partitioned over DP (assert_zero_partitions);
    ZeRO-2: the gradients too: reduced over DP after every micro-batch's backward, each rank keeping its part
            (ZeRO-0/1 accumulate whole gradients and reduce them once per step);
    ZeRO-3: the gradients as ZeRO-2, and the parameters: each rank holds 1/dp of every parameter and all-gathers them
            in every micro-batch's forward (ZeRO-1/2 gather the updated weights once per step)."""
    n, overrides = LAYOUTS[name]
    d = layout_dims(n, overrides)
    ranks = runs(name).ranks
    assert_zero_partitions(name, ranks, d)
    reduces = ("all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base")
    gathers = ("all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_gather")
    for e in ranks:
        dp_group, params = mesh_group(e["rank"], "dp", d["mesh"]), params_numel(e)
        per_step = {"reduced": elements_on(e, reduces, dp_group) / e["steps"],
                    "gathered": elements_on(e, gathers, dp_group) / e["steps"]}
        at_most_once = params * 1.01 + 64 * d["dp"]
        if d["zero"] >= 2:
            assert per_step["reduced"] >= d["micro_batches"] * params, (
                f"{name} rank {e['rank']}: {per_step['reduced']:,.0f} gradient elements reduced over DP {dp_group} per "
                f"step for {params:,} parameters and {d['micro_batches']} micro-batches: ZeRO-{d['zero']} reduces "
                f"each micro-batch's gradients; its collectives: {collectives(e)}")
        else:
            assert per_step["reduced"] <= at_most_once, (name, e["rank"], per_step, params)
        held = sum(p["held"] for p in e["params"].values())
        if d["zero"] == 3:
            assert held <= params / d["dp"] * 1.01 + 64 and per_step["gathered"] >= d["micro_batches"] * params, (
                f"{name} rank {e['rank']}: holds {held:,} of its {params:,} parameter elements and all-gathers "
                f"{per_step['gathered']:,.0f} per step over DP {dp_group}: ZeRO-3 partitions the parameters; its "
                f"collectives: {collectives(e)}")
        else:
            assert held == params and per_step["gathered"] <= at_most_once, (name, e["rank"], held, per_step)


def test_reference_follows_its_pinned_curve(reference, corpus):
    """The 1-process run every layout here is compared with, against its pinned curve
    (tests/support/reference_curves.py: tolerance and why)."""
    assert_follows_pinned("layouts-6-steps", reference, corpus, [f"training.train_steps={STEPS}",
                                                                 "training.eval_interval=3"])


def test_loss_falls_on_real_shards(reference):
    records = train_records(reference)
    first, last = records[0]["loss"], records[-1]["loss"]
    assert math.log(257) - 0.5 < first < math.log(257) + 1.0  # starts near uniform over the byte vocabulary
    assert last < first - 0.7, f"loss did not fall: {[r['loss'] for r in records]}"
    val = val_losses(reference)
    assert sorted(val) == [3, 6], "validation runs every eval_interval = 3 steps"
    assert val[6] < val[3] < math.log(257)
    for r in records:  # the per-step metrics the README promises
        for key in ("lr", "grad_norm", "loss_scale", "tokens_per_s", "tflops_per_gpu", "mfu", "mem_gb"):
            assert math.isfinite(r[key]), (key, r)


GPT_SHAPE = ["model.tied_embeddings=true", "model.position_embedding=learned", "model.activation=gelu",
             "model.normalization=layernorm", "model.add_bias_linear=true"]


def test_gpt_shape_tied_embeddings_across_pipeline_stages(corpus, tmp_path):
    """Tied input/output embeddings live on the first and the last stage (TiedLayerSpec); GeLU, learned positions,
    LayerNorm and biases. TP=2 x PP=2 x DP=1 must match TP=1 x PP=1 x DP=1."""
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "tp2pp2"
    pretrain(1, *on_corpus(ref_dir, corpus), f"training.train_steps={STEPS}", *GPT_SHAPE)
    pretrain(4, *on_corpus(run_dir, corpus), f"training.train_steps={STEPS}", "parallel.tp=2", "parallel.pp=2", *GPT_SHAPE)
    ref, got = losses(ref_dir), losses(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    assert worst <= REL_TOL, f"per-step losses {got} vs 1x1x1 {ref} (worst relative difference {worst:.2e})"


def test_pp4_with_a_large_vocabulary_matches_single_process(corpus, tmp_path):
    """Regression: TP=1 x PP=4 x DP=2 with a vocabulary far larger than a layer (3,000 rows vs 4 tiny layers) hung in
    the first optimizer step when the parameter-balanced split gave the embedding and the head stages of their own
    (their optimizers had one param group, the others two; ZeRO-1 all-reduces the grad norm per group across stages).
    The default split gives every stage decoder layers, is the one validation predicts, and matches 1x1x1."""
    big = ["model.vocab_size=3000", f"training.train_steps={STEPS}"]
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "pp4"
    pretrain(1, *on_corpus(ref_dir, corpus), *big)
    pretrain(8, *on_corpus(run_dir, corpus), "parallel.pp=4", "training.dist_timeout_minutes=2", *big, timeout=400)
    ref, got = losses(ref_dir), losses(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    assert worst <= REL_TOL, f"per-step losses {got} vs 1x1x1 {ref} (worst relative difference {worst:.2e})"

    # the layers each pipeline rank saved are the split validation predicts (stage s: mp_rank file s at tp = 1)
    recipe = load_recipe(REPO / RECIPE, ["model.vocab_size=3000", "parallel.pp=4"])
    parts = stage_boundaries(recipe.model, 1, 4, recipe.parallel.pipeline_partition)
    tag = run_dir / (run_dir / "latest").read_text().strip()
    held = [sorted({int(k.split(".", 1)[0]) for k in safe_load.load(tag / f"mp_rank_{s:02d}_model_states.pt")["module"]})
            for s in range(4)]
    assert held == [list(range(a, b)) for a, b in zip(parts, parts[1:])], (held, parts)
    # specs: 0 embedding, 1..L decoder layers, L+1 final norm, L+2 head: first and last stage hold a decoder layer
    assert parts[1] >= 2 and parts[-2] <= recipe.model.num_layers, parts


def test_document_mask_layout_matches_single_process(short_doc_corpus, tmp_path):
    """model.document_mask through TP=2 x PP=2 x DP=2 (position ids cross the stage boundary with the hidden state)
    matches TP=1 x PP=1 x DP=1, on documents of at most 40 bytes (every 64-token sample packs several). The parallel
    run also reads through DataLoader workers (data.num_workers), which must not change a sample either."""
    mask = ["model.document_mask=true", f"training.train_steps={STEPS}", "training.eval_interval=3"]
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "tp2pp2dp2"
    pretrain(1, *on_corpus(ref_dir, short_doc_corpus), *mask)
    pretrain(8, *on_corpus(run_dir, short_doc_corpus), *mask, "parallel.tp=2", "parallel.pp=2",
             "parallel.zero_stage=1", "data.num_workers=1", timeout=400)
    ref, got = losses(ref_dir), losses(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    assert worst <= REL_TOL, f"per-step losses {got} vs 1x1x1 {ref} (worst relative difference {worst:.2e})"
    ref_val, got_val = val_losses(ref_dir), val_losses(run_dir)
    assert sorted(got_val) == sorted(ref_val) == [3, 6]
    assert all(abs(got_val[s] - ref_val[s]) <= REL_TOL * ref_val[s] for s in ref_val), (got_val, ref_val)

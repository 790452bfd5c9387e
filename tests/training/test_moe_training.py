"""MoE training on CPU ranks: expert-parallel layouts give the 1-process losses, aux loss and routing; a capacity
factor drops the same tokens everywhere; a killed expert-parallel run resumes bit for bit.

The model: the tiny recipe with 4 experts (top-2) in layers 1, 2 and 4 (layer 3 dense), a gated shared expert, the
load-balancing aux loss and the z-loss, so that dense and MoE layers, both losses and the shared expert all take part.

Tolerance as tests/training/test_training_layouts.py (fp32; TP, EP and DP change only the order of additions), at the
1e-5 the task sets: a missing expert-gradient reduction, experts averaged over the wrong group, an aux loss scaled
as the main loss is not (e.g. not divided by the micro-batches) or a token sent to the wrong rank moves the loss by
far more from the first steps on.
"""
from __future__ import annotations

import math
import subprocess

import pytest

from tests.support.observed import ObservedRuns, calls_on, collectives, layout_dims, mesh_group
from tests.support.reference_curves import assert_follows_pinned
from tests.support.runs import (REPO, kill_group, losses, on_corpus, pretrain, pretrain_cmd, train_records,
                                wait_for_step, worker_env)

pytestmark = pytest.mark.multiproc

STEPS = 8
REL_TOL = 1e-5
MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.layer_pattern=[1,1,0,1]",
       "model.moe.shared_expert_ffn_size=64", "model.moe.shared_expert_gate=true", "model.moe.aux_loss_coeff=0.01",
       "model.moe.z_loss_coeff=0.001", f"training.train_steps={STEPS}"]
CAPACITY = ["model.moe.capacity_factor=1.0"]
ROUTING_SLACK = 8  # assignments of a layer (of 8 x 64 x 2 = 1,024 per step) or drops that near-ties may move


def _run(n, run_dir, corpus, *overrides, timeout=600):
    pretrain(n, *on_corpus(run_dir, corpus), *MOE, *overrides, timeout=timeout)
    return {r["step"]: r for r in train_records(run_dir)}


@pytest.fixture(scope="module")
def reference_dirs(corpus, tmp_path_factory):
    """The 1-process runs (without and with a capacity factor), made once each when first asked for."""
    made = {}

    def get(capacity: bool):
        if capacity not in made:
            made[capacity] = tmp_path_factory.mktemp("moe_cap_ref" if capacity else "moe_ref")
            _run(1, made[capacity], corpus, *(CAPACITY if capacity else []))
        return made[capacity]

    return get


@pytest.fixture(scope="module")
def reference(reference_dirs):
    return {r["step"]: r for r in train_records(reference_dirs(False))}


@pytest.fixture(scope="module")
def capacity_reference(reference_dirs):
    return {r["step"]: r for r in train_records(reference_dirs(True))}


@pytest.mark.parametrize("capacity", [False, True], ids=["dropless", "capacity"])
def test_reference_follows_its_pinned_curve(capacity, reference_dirs, corpus):
    """The 1-process runs the layouts here are compared with, against their pinned curves
    (tests/support/reference_curves.py: tolerance and why)."""
    assert_follows_pinned("moe-8-steps" + ("-capacity" if capacity else ""), reference_dirs(capacity), corpus,
                          [*MOE, *(CAPACITY if capacity else [])])


def _rel(a, b):
    return abs(a - b) / abs(b)


def _assert_same_training(got: dict, ref: dict, name: str) -> None:
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    worst = max(_rel(got[s]["loss"], ref[s]["loss"]) for s in ref)
    assert worst <= REL_TOL, f"{name}: losses {[got[s]['loss'] for s in got]} vs {[ref[s]['loss'] for s in ref]}"
    for key in ("grad_norm", "moe_aux_loss", "moe_z_loss"):  # the aux losses are in the gradient: same norms
        worst = max(_rel(got[s][key], ref[s][key]) for s in ref)
        assert worst <= 10 * REL_TOL, f"{name}: {key} {[got[s][key] for s in got]} vs {[ref[s][key] for s in ref]}"
    for s in ref:  # the same routing (a near-tie may flip one token-expert choice in a few thousand)
        for mine, theirs in zip(got[s]["moe_tokens_per_expert"], ref[s]["moe_tokens_per_expert"], strict=True):
            assert sum(abs(a - b) for a, b in zip(mine, theirs, strict=True)) <= 2, (
                s, got[s]["moe_tokens_per_expert"], ref[s]["moe_tokens_per_expert"])
        assert abs(got[s]["moe_dropped_tokens"] - ref[s]["moe_dropped_tokens"]) <= 2


LAYOUTS = {
    "ep2-dp2": (4, ["parallel.ep=2"]),
    "ep2-dp2-zero2": (4, ["parallel.ep=2", "parallel.zero_stage=2"]),  # gradients partitioned too
    "tp2-ep2-pp2": (8, ["parallel.tp=2", "parallel.ep=2", "parallel.pp=2"]),
}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """Each layout trained once, observed from inside its ranks (tests/support/observed.py)."""
    def make(name, run_dir, observe):
        n, overrides = LAYOUTS[name]
        pretrain(n, *on_corpus(run_dir, corpus), *MOE, *overrides, timeout=600, observe=observe)

    return ObservedRuns(tmp_path_factory, make)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_expert_parallel_layout_matches_single_process(name, reference, runs):
    got = {r["step"]: r for r in train_records(runs(name).run_dir)}
    _assert_same_training(got, reference, name)
    tokens = 8 * 64 * 2  # global batch x seq_length x top_k assignments per MoE layer and step
    assert all(sum(t) == tokens for t in got[1]["moe_tokens_per_expert"])
    assert got[1]["moe_dropped_tokens"] == 0  # dropless


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_expert_parallelism_is_on(name, runs):
    """Every expert on every rank (EP silently 1: plain DP over the experts) gives the same losses. Under EP each
    rank holds E/ep of each MoE layer's experts and steps them; the ranks of an EP group hold disjoint slices that
    cover all E in rank order; tokens reach their experts by all-to-all over that group (dispatch and combine: at
    least 2 per MoE layer and micro-batch); and ZeRO keeps fp32 masters for the rank's own experts only, 1/edp of
    them (the expert-data-parallel ranks holding the same slice share them)."""
    n, overrides = LAYOUTS[name]
    d = layout_dims(n, [*MOE, *overrides])
    experts, edp = 4, d["cp"] * d["dp"] // d["ep"]
    ranks = runs(name).ranks
    for e in ranks:
        ep_group = mesh_group(e["rank"], "ep", d["expert_mesh"])
        assert e["experts"], f"{name} rank {e['rank']}: no MoE layer"
        for layer in e["experts"]:
            held = [next(x["experts"] for x in ranks[r]["experts"] if x["layer"] == layer["layer"]) for r in ep_group]
            n_local = experts // d["ep"]
            assert held == [list(range(i * n_local, (i + 1) * n_local)) for i in range(d["ep"])], (
                f"{name} rank {e['rank']}: MoE layer {layer['layer']}'s experts held by EP group {ep_group}: {held}; "
                f"with EP={d['ep']} each holds {n_local} of {experts}: expert parallelism is off")
            assert {shape[0] for shape in layer["shapes"]} == {n_local} and layer["every_expert_stepped"], (
                name, e["rank"], layer)
        exchanges = calls_on(e, ("all_to_all_single", "all_to_all"), ep_group)
        want = 2 * len(e["experts"]) * d["micro_batches"] * e["steps"]
        assert exchanges >= want, (
            f"{name} rank {e['rank']}: {exchanges} all-to-alls over EP group {ep_group} in {e['steps']} steps, "
            f"expected >= {want}: tokens do not travel to their experts; its collectives: {collectives(e)}")
        local = sum(math.prod(shape) for layer in e["experts"] for shape in layer["shapes"])
        masters = e["optimizer"]["expert_masters_numel"]
        assert local <= masters * edp <= local + 64 * edp, (
            f"{name} rank {e['rank']}: fp32 masters of {masters:,} expert elements for its {local:,} (EDP {edp}): "
            "ZeRO does not keep the experts in DeepSpeed's expert param groups")


def test_capacity_factor_drops_the_same_tokens_under_expert_parallelism(capacity_reference, corpus, tmp_path):
    """capacity_factor=1.0: each expert takes at most 32 of a micro-batch's 64 x 2 assignments, per rank. The
    1-process run counts its drops (equal to a direct count: tests/training/test_moe_layer.py); EP2 x DP2 routes and
    drops the same tokens while the two runs' weights differ only by float summation order (steps 1-4 here) but for
    near-ties: a router logit within rounding of a tie flips, and the flip can push a token over or under an expert's
    capacity. Measured: steps 1-2 identical, then 1-3 of a layer's 1,024 assignments and 3 of ~850 drops differ at
    steps 3-4 on this AMD EPYC VM (none at steps 1-4 on an earlier machine), so up to ROUTING_SLACK is allowed there.
    After that, dropping amplifies the differences (here 11-19 assignments at steps 5-6, the losses by 3e-5 at step
    7), so later steps are compared by their drops' existence, not their identity."""
    assert all(r["moe_dropped_tokens"] > 0 for r in capacity_reference.values()), "capacity 1.0 should drop"
    assert all(max(max(t) for t in r["moe_tokens_per_expert"]) <= 8 * 32 for r in capacity_reference.values())
    got = _run(4, tmp_path, corpus, *CAPACITY, "parallel.ep=2")
    assert sorted(got) == sorted(capacity_reference) == list(range(1, STEPS + 1))
    for s in range(1, 5):
        ref = capacity_reference[s]
        for mine, theirs in zip(got[s]["moe_tokens_per_expert"], ref["moe_tokens_per_expert"], strict=True):
            assert sum(abs(a - b) for a, b in zip(mine, theirs, strict=True)) <= ROUTING_SLACK, (
                s, got[s]["moe_tokens_per_expert"], ref["moe_tokens_per_expert"])
        assert abs(got[s]["moe_dropped_tokens"] - ref["moe_dropped_tokens"]) <= ROUTING_SLACK, s
        assert _rel(got[s]["loss"], ref["loss"]) <= REL_TOL, (s, got[s]["loss"], ref["loss"])
    assert all(r["moe_dropped_tokens"] > 0 for r in got.values())


RESUME = ["parallel.pp=2", "parallel.ep=2", "checkpoint.save_interval=2", "checkpoint.keep_last=2"]


def test_killed_expert_parallel_run_resumes_bitwise(corpus, tmp_path):
    """PP=2 x DP=2 with EP=2 (each stage's experts split over its two DP ranks), SIGKILL after step 5, auto-resume:
    the same loss floats as the uninterrupted run. The experts of the second EP rank live only in that rank's ZeRO
    partition; the module weights DeepSpeed loads come from DP rank 0's file and are rebuilt from the masters."""
    ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    ref = losses_of(_run(4, ref_dir, corpus, *RESUME))
    proc = subprocess.Popen(pretrain_cmd(4, *on_corpus(run_dir, corpus), *MOE, *RESUME, "checkpoint.async_save=false"),
                            cwd=REPO, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for_step(run_dir / "logs" / "metrics.jsonl", 5, proc)
    finally:
        kill_group(proc)
    assert max(losses(run_dir)) < STEPS
    resumed = pretrain(4, *on_corpus(run_dir, corpus), *MOE, *RESUME)
    assert "resumed from" in resumed.stdout + resumed.stderr
    got = losses(run_dir)
    assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]


def losses_of(records: dict) -> dict:
    return {s: r["loss"] for s, r in records.items()}


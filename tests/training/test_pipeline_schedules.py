"""The pipeline schedules (torch.distributed.pipelining under DeepSpeed's ZeRO, recipes.parallel.pipeline) give the
1-process per-step losses: interleaved 1F1B with data parallelism, with tensor parallelism, over 4 ranks x 2 chunks,
zero-bubble, and with experts split over EP ranks. And interleaving is really on (a plain 1F1B split gives the same
losses): each pipeline rank runs its virtual stages on an interleaved schedule, saved the layers of its two chunks (not
a contiguous block), and its hidden states cross every virtual stage boundary (tests/support/observed.py).

Tolerance: 1e-5 relative, as the layout tests (tests/training/test_training_layouts.py: fp32 on CPU, the layouts
change only the order of additions; a wiring error moves the loss by >1e-3 from the first steps on).
"""
from __future__ import annotations

import pytest

from recipes.checkpoint import safe_load
from tests.support.observed import ObservedRuns, calls_on, collectives, layout_dims, mesh_group
from tests.support.reference_curves import assert_follows_pinned
from tests.support.runs import losses, on_corpus, pretrain, val_losses

pytestmark = pytest.mark.multiproc

STEPS = 4
REL_TOL = 1e-5
EIGHT_LAYERS = ["model.num_layers=8"]
MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.layer_pattern=[1,1,0,1]",
       "model.moe.aux_loss_coeff=0.01"]
CASES = {  # name: (ranks, overrides, model)
    "pp2-vpp2-dp2-zero1": (4, ["parallel.pp=2", "parallel.vpp=2", "parallel.zero_stage=1"], []),
    "tp2-pp2-vpp2": (4, ["parallel.tp=2", "parallel.pp=2", "parallel.vpp=2"], []),
    "pp4-vpp2-8-layers": (4, ["parallel.pp=4", "parallel.vpp=2"], EIGHT_LAYERS),
    "zero-bubble-pp2-vpp2": (2, ["parallel.pp=2", "parallel.vpp=2", "parallel.pipeline_schedule=zero_bubble"], []),
    "moe-ep2-pp2-vpp2": (4, ["parallel.ep=2", "parallel.pp=2", "parallel.vpp=2"], MOE),
}
COMMON = [f"training.train_steps={STEPS}", "training.eval_interval=2"]


@pytest.fixture(scope="module")
def references(corpus, tmp_path_factory):
    """The 1-process run of each model the cases train, made once."""
    made = {}

    def get(model: list[str]):
        key = tuple(model)
        if key not in made:
            run_dir = tmp_path_factory.mktemp("reference")
            pretrain(1, *on_corpus(run_dir, corpus), *COMMON, *model)
            made[key] = run_dir
        return made[key]

    return get


@pytest.mark.parametrize("model", ["dense", "8-layers", "moe"])
def test_reference_follows_its_pinned_curve(model, references, corpus):
    """The 1-process runs the cases here are compared with, against their pinned curves
    (tests/support/reference_curves.py: tolerance and why)."""
    overrides = {"dense": [], "8-layers": EIGHT_LAYERS, "moe": MOE}[model]
    assert_follows_pinned(f"pipeline-4-steps-{model}", references(overrides), corpus, [*COMMON, *overrides])


def _worst(got: dict, ref: dict) -> float:
    assert sorted(got) == sorted(ref), (got, ref)
    return max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """Each case trained once, observed from inside its ranks (tests/support/observed.py)."""
    def make(name, run_dir, observe):
        n, layout, model = CASES[name]
        pretrain(n, *on_corpus(run_dir, corpus), *COMMON, *model, *layout, timeout=600, observe=observe)

    return ObservedRuns(tmp_path_factory, make)


@pytest.mark.parametrize("name", list(CASES))
def test_schedule_matches_single_process(name, references, runs):
    n, layout, model = CASES[name]
    ref, run_dir = references(model), runs(name).run_dir
    assert sorted(losses(run_dir)) == list(range(1, STEPS + 1))
    worst = _worst(losses(run_dir), losses(ref))
    print(f"{name}: worst relative loss difference vs 1 process {worst:.2e}")
    assert worst <= REL_TOL, f"{name}: {losses(run_dir)} vs 1 process {losses(ref)} ({worst:.2e})"
    assert _worst(val_losses(run_dir), val_losses(ref)) <= REL_TOL  # evaluation through the same schedule


@pytest.mark.parametrize("name", list(CASES))
def test_virtual_stages_are_on(name, runs):
    """A plain 1F1B split at the same PP (VPP silently 1) gives the same losses. With VPP, pipeline rank p runs the
    virtual stages p, p + pp, ... on an interleaved schedule; the chunks of all ranks, in stage order, are the model's
    layers once each; and every micro-batch crosses each of the pp x vpp - 1 stage boundaries forward and backward:
    2 (pp vpp - 1) hidden-state sends per micro-batch over each pipeline (2 (pp - 1) without VPP)."""
    n, layout, model = CASES[name]
    d = layout_dims(n, [*layout, *model])
    pp, vpp = d["pp"], d["vpp"]
    layers = 8 if model == EIGHT_LAYERS else 4
    ranks = runs(name).ranks
    for e in ranks:
        pipeline = mesh_group(e["rank"], "pp", d["mesh"])
        p, run = pipeline.index(e["rank"]), e["pipeline"]
        assert run["stages"] == [p + pp * v for v in range(vpp)] and run["num_stages"] == pp * vpp, (
            f"{name} rank {e['rank']}: runs virtual stages {run['stages']} of {run['num_stages']} with "
            f"{run['schedule']}; with PP={pp} x VPP={vpp} pipeline rank {p} runs {[p + pp * v for v in range(vpp)]}")
        assert run["schedule"] in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"), run
        chunks = {s: c for r in pipeline for s, c in zip(ranks[r]["pipeline"]["stages"], ranks[r]["pipeline"]["chunks"],
                                                         strict=True)}
        assert [i for s in sorted(chunks) for i in chunks[s]] == list(range(layers + 3)), chunks
        sends = sum(calls_on(ranks[r], ("isend", "send"), pipeline, lambda shapes: len(shapes[0]) == 3)
                    for r in pipeline) / e["steps"]
        want = 2 * (pp * vpp - 1) * d["micro_batches"]
        assert sends == want, (
            f"{name}: pipeline {pipeline} sent {sends:g} hidden states per step, {want} expected from "
            f"{pp * vpp} stages and {d['micro_batches']} micro-batches: the virtual stages do not run interleaved; "
            f"rank {e['rank']}'s collectives: {collectives(e)}")


def test_interleaving_puts_two_chunks_on_each_rank(runs):
    """PP=2 x VPP=2 over the tiny model's 4 decoder layers: pipeline rank 0 holds chunks 0 and 2 (embedding, layer 1,
    layer 3), rank 1 chunks 1 and 3 (layer 2, layer 4, norm, head), as each stage's checkpoint file shows; 1F1B at
    PP=2 would give rank 0 layers 1-2."""
    run_dir = runs("pp2-vpp2-dp2-zero1").run_dir
    tag = run_dir / (run_dir / "latest").read_text().strip()
    held = [sorted({int(k.split(".", 1)[0]) for k in safe_load.load(tag / f"mp_rank_{r:02d}_model_states.pt")["module"]})
            for r in range(2)]
    assert held == [[0, 1, 3], [2, 4, 5, 6]], held

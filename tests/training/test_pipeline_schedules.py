"""The pipeline schedules (torch.distributed.pipelining under DeepSpeed's ZeRO, recipes.parallel.pipeline) give the
1-process per-step losses: interleaved 1F1B with data parallelism, with tensor parallelism, over 4 ranks x 2 chunks,
zero-bubble, and with experts split over EP ranks. And interleaving is really on: each pipeline rank saved the layers
of its two chunks (not a contiguous block), which a plain 1F1B split cannot give.

Tolerance: 1e-5 relative, as the layout tests (tests/training/test_training_layouts.py: fp32 on CPU, the layouts
change only the order of additions; a wiring error moves the loss by >1e-3 from the first steps on).
"""
from __future__ import annotations

import pytest

from recipes.checkpoint import safe_load
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


def _worst(got: dict, ref: dict) -> float:
    assert sorted(got) == sorted(ref), (got, ref)
    return max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)


@pytest.mark.parametrize("name", list(CASES))
def test_schedule_matches_single_process(name, references, corpus, tmp_path):
    n, layout, model = CASES[name]
    ref = references(model)
    pretrain(n, *on_corpus(tmp_path, corpus), *COMMON, *model, *layout, timeout=600)
    assert sorted(losses(tmp_path)) == list(range(1, STEPS + 1))
    worst = _worst(losses(tmp_path), losses(ref))
    print(f"{name}: worst relative loss difference vs 1 process {worst:.2e}")
    assert worst <= REL_TOL, f"{name}: {losses(tmp_path)} vs 1 process {losses(ref)} ({worst:.2e})"
    assert _worst(val_losses(tmp_path), val_losses(ref)) <= REL_TOL  # evaluation through the same schedule


def test_interleaving_puts_two_chunks_on_each_rank(corpus, tmp_path):
    """PP=2 x VPP=2 over the tiny model's 4 decoder layers: rank 0 holds chunks 0 and 2 (embedding, layer 1, layer 3),
    rank 1 chunks 1 and 3 (layer 2, layer 4, norm, head), as each rank's checkpoint file shows; 1F1B at PP=2 would
    give rank 0 layers 1-2."""
    pretrain(2, *on_corpus(tmp_path, corpus), "training.train_steps=1", "parallel.pp=2", "parallel.vpp=2")
    tag = tmp_path / (tmp_path / "latest").read_text().strip()
    held = [sorted({int(k.split(".", 1)[0]) for k in safe_load.load(tag / f"mp_rank_{r:02d}_model_states.pt")["module"]})
            for r in range(2)]
    assert held == [[0, 1, 3], [2, 4, 5, 6]], held

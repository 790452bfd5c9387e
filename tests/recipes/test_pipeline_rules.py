"""The pipeline's virtual stages and schedule in the one layout validator (recipes.parallel.layout): each of the
pp x vpp chunks needs a decoder layer, 1F1B runs one chunk per rank and interleaved 1F1B several, torch's multi-chunk
schedules need whole rounds of pp micro-batches, ZeRO-2/3 are refused at pp > 1 naming why; and the split gives the
first and last chunks (embedding, head and loss) the fewer layers."""
from __future__ import annotations

import pytest

from recipes.config.loading import load_recipe
from recipes.parallel.layout import pipeline_bubble, resolve_layout
from recipes.parallel.partition import chunk_layers, rank_layers

pytestmark = pytest.mark.unit

TINY = "configs/runs/tiny-cpu.yaml"  # 4 decoder layers, global batch 8


def problems(world: int, *overrides: str) -> list[str]:
    return [str(p) for p in resolve_layout(load_recipe(TINY, list(overrides)), world)[1]]


def test_the_rules_of_virtual_stages_and_schedules():
    assert problems(2, "parallel.pp=2", "parallel.vpp=2") == []
    assert problems(2, "parallel.pp=2", "parallel.pipeline_schedule=zero_bubble") == []
    [p] = problems(2, "parallel.pp=2", "parallel.vpp=3")
    assert "2 x 3 = 6 model chunks for model.num_layers=4" in p and "use vpp in [1, 2]" in p
    [p] = problems(2, "parallel.pp=2", "parallel.vpp=2", "parallel.pipeline_schedule=1f1b")
    assert "runs one model chunk per pipeline rank, but parallel.vpp=2" in p
    [p] = problems(2, "parallel.pp=2", "parallel.pipeline_schedule=interleaved_1f1b")
    assert "needs several model chunks per pipeline rank, but parallel.vpp=1" in p
    [p] = problems(1, "parallel.vpp=2")
    assert "parallel.vpp=2 with parallel.pp=1" in p
    [p] = problems(2, "parallel.pp=2", "parallel.vpp=2", "training.global_batch=5")
    assert "5 micro-batches per step" in p and "global_batch = 2 or 4" in p
    [p] = problems(2, "parallel.pp=2", "parallel.zero_stage=2")
    assert "ZeRO-2 reduces each gradient while the engine runs the backward" in p


def test_the_split_puts_the_extra_layers_in_the_middle_and_interleaves_chunks():
    model = load_recipe(TINY, ["model.num_layers=6"]).model
    # 6 decoder layers over 4 chunks: 1, 2, 2, 1 (indices: 0 embedding, 1..6 layers, 7 norm, 8 head)
    assert chunk_layers(model, 1, 2, 2, "uniform") == [[0, 1], [2, 3], [4, 5], [6, 7, 8]]
    assert rank_layers(model, 1, 2, 2, "uniform") == [[0, 1, 4, 5], [2, 3, 6, 7, 8]]


def test_the_bubble_formula_per_schedule():
    assert pipeline_bubble("1f1b", 16, 1, 32) == pytest.approx(15 / 32)
    assert pipeline_bubble("interleaved_1f1b", 16, 4, 32) == pytest.approx(15 / 128)
    assert pipeline_bubble("zero_bubble", 16, 1, 32) == pytest.approx(15 / 32 / 3)
    assert pipeline_bubble("1f1b", 1, 1, 32) == 0.0

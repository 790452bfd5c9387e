"""Data stages: the schema refuses stages that do not fit the run (naming the field and the fix), the lr segment of a
stage replaces the run's schedule there, and the staged dataset switches corpus exactly at the boundary step with
each stage read from its own first sample (checked on megatron-core's real GPTDataset over two corpora)."""
from __future__ import annotations

from pathlib import Path

import pytest

from recipes.config.loading import RecipeError, load_recipe
from recipes.config.stages import stage_plan, with_stage_lr
from recipes.train.data import build_datasets
from recipes.train.engine import lr_multiplier
from recipes.train.stages import build_stage_datasets
from tests.support.corpus import write_corpus, write_digit_corpus

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DIGITS = set(range(48, 58)) | {256}


def _recipe(*overrides):
    return load_recipe(REPO / "configs" / "runs" / "tiny-cpu.yaml", list(overrides))


def test_stage_lengths_by_steps_tokens_and_rest():
    # tiny-cpu: global batch 8 x seq 64 = 512 tokens per step; 1000 tokens round up to 2 steps.
    r = _recipe("training.train_steps=10", "data.manifests=[m]",
                "data.stages=[{name: a, steps: 3}, {name: b}, {name: c, tokens: 1000}]")
    assert [(s.name, s.start, s.end) for s in stage_plan(r)] == [("a", 0, 3), ("b", 3, 8), ("c", 8, 10)]


@pytest.mark.parametrize("stages, expected", [
    ("[{steps: 3, tokens: 512}]", "sets both steps=3 and tokens=512"),
    ("[{name: a}, {name: b}]", "only one stage may take the rest"),
    ("[{steps: 4}, {steps: 4}]", "add up to 8 steps but the run has training.train_steps=10"),
    ("[{steps: 10}, {name: rest}]", "leaving 0 for data.stages.1 (rest)"),
    ("[{name: a, steps: 5}, {name: a}]", "stage name(s) a used twice"),
    ("[{steps: 5, manifestz: [x]}, {}]", "did you mean 'data.stages.0.manifests'"),
])
def test_bad_stages_name_the_field_and_fix(stages, expected):
    with pytest.raises(RecipeError, match="data.stages") as e:
        _recipe("training.train_steps=10", "data.manifests=[m]", f"data.stages={stages}")
    assert expected in str(e.value)


def test_stage_without_any_data_is_refused():
    with pytest.raises(RecipeError, match=r"data.stages.0 \(main\): no manifests or blend.*give the stage its data"):
        _recipe("training.train_steps=4", "data.stages=[{name: main}]")


def test_anneal_segment_replaces_the_schedule_in_its_stage():
    # warmup-stable-decay: 2 warmup steps, constant lr, then a linear anneal to 0 over the last 4 of 10 steps.
    r = _recipe("training.train_steps=10", "training.schedule.decay=constant", "training.schedule.warmup_steps=2",
                "data.manifests=[m]", "data.stages=[{name: main}, {name: anneal, steps: 4, lr: {end_lr: 0.0}}]")
    f = lr_multiplier(r, 10)
    assert [f(s) for s in range(10)] == pytest.approx([0.5, 1, 1, 1, 1, 1, 1, 0.75, 0.5, 0.25])
    # an explicit start and a cosine shape; a later stage without a segment follows training.schedule again
    r = _recipe("training.train_steps=10", "training.schedule.decay=constant", "data.manifests=[m]",
                "data.stages=[{steps: 2}, {steps: 4, lr: {decay: cosine, start_lr: 1.5e-3, end_lr: 3.0e-4}}, {}]")
    f = lr_multiplier(r, 10)
    peak = r.training.optimizer.lr
    assert f(2) * peak == pytest.approx(1.5e-3) and f(4) * peak == pytest.approx((1.5e-3 + 3e-4) / 2)
    assert f(6) == 1.0 and f(1) == 1.0
    # no stages: the run's schedule, unchanged
    plain = _recipe("training.train_steps=10")
    assert with_stage_lr(stage_plan(plain), lr_multiplier(plain, 10), 1.0)(5) == lr_multiplier(plain, 10)(5)


@pytest.fixture
def world_of_one():
    import torch

    # megatron-core's blended dataset asks for the rank; reuse a world another in-process test may hold.
    made = not torch.distributed.is_initialized()
    if made:
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    yield
    if made:
        torch.distributed.destroy_process_group()


def test_staged_dataset_switches_exactly_at_the_boundary(tmp_path, world_of_one):
    code = write_corpus(tmp_path / "code")
    digits = write_digit_corpus(tmp_path / "digits")
    # 5 + 3 steps: the anneal stage starts at sample 40, not a multiple of its own length (24), so reading it by
    # global index instead of from its own start would show
    r = _recipe("training.train_steps=8", f"data.manifests=[{code}]",
                f"data.stages=[{{name: main, steps: 5}}, {{name: anneal, manifests: [{digits}]}}]")
    gb = r.training.global_batch
    staged, valid, plan = build_stage_datasets(r, 2 * gb, str(tmp_path / "cache"))
    assert len(staged) == 8 * gb and [s.name for s in plan] == ["main", "anneal"]
    boundary = 5 * gb
    for k in range(len(staged)):
        tokens = set(staged[k]["tokens"].tolist())
        assert (tokens <= DIGITS) == (k >= boundary), f"sample {k}"
    # each stage is addressed from its own first sample: the anneal stage's dataset item 0 is global sample 40
    anneal_only, _ = build_datasets(r, 3 * gb, 2 * gb, str(tmp_path / "cache"), source=plan[1].stage)
    for i in range(3 * gb):
        assert staged[boundary + i]["tokens"].tolist() == anneal_only[i]["tokens"].tolist()
    # validation reads data.manifests (the code corpus) for the whole run
    assert not set(valid[0]["tokens"].tolist()) <= DIGITS

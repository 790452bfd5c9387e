"""logging.wandb (issue 26, item 3): the recipe keys and their errors, and which W&B run id a training run uses
(recipes.train.tracking.run_id). The run across a real kill + restart: tests/training/test_wandb_tracking.py."""
from __future__ import annotations

import pytest

from recipes.config.loading import RecipeError, load_recipe
from recipes.train.tracking import ID_FILE, plan_summary, run_id
from tests.support.runs import RECIPE

pytestmark = pytest.mark.unit


def _recipe(*overrides):
    return load_recipe(RECIPE, list(overrides))


def test_every_key_reaches_the_recipe():
    w = _recipe("logging.wandb={project: p1, entity: team, group: ablation, tags: [a, b], name: r1, mode: offline}")
    assert (w.logging.wandb.project, w.logging.wandb.entity, w.logging.wandb.group, w.logging.wandb.tags,
            w.logging.wandb.name, w.logging.wandb.mode) == ("p1", "team", "ablation", ["a", "b"], "r1", "offline")
    assert _recipe().logging.wandb is None  # off unless asked


def test_the_older_project_key_still_works():
    assert _recipe("logging.wandb_project=p2").logging.wandb.project == "p2"


@pytest.mark.parametrize("override, says", [
    ("logging.wandb={project: a/b}", "logging.wandb.project = 'a/b'"),
    ("logging.wandb={entity: team}", "logging.wandb.project: required field missing"),
    ("logging.wandb={project: p, mode: offlin}", "logging.wandb.mode = 'offlin'"),
    ("logging.wandb={project: p, tags: [" + "x" * 65 + "]}", "logging.wandb.tags"),
    ("logging.wandb={project: p, colour: red}", "logging.wandb.colour: unknown key"),
])
def test_bad_values_name_the_key(override, says):
    with pytest.raises(RecipeError) as e:
        _recipe(override)
    assert says in str(e.value), str(e.value)


def test_two_projects_that_disagree_are_refused():
    with pytest.raises(RecipeError, match="logging.wandb_project and logging.wandb.project disagree"):
        _recipe("logging.wandb_project=a", "logging.wandb={project: b}")


def test_the_run_id_comes_from_the_log_dir_that_started_it_then_is_new(tmp_path):
    first, new = run_id(None, tmp_path, "tiny cpu/7")
    assert new and first.startswith("tiny-cpu-7-") and (tmp_path / ID_FILE).read_text().strip() == first
    assert run_id(None, tmp_path, "tiny cpu/7") == (first, False)  # a restart before the first checkpoint
    assert run_id(first, tmp_path, "x") == (first, False)  # a restart from its checkpoint
    # a checkpoint naming a W&B run this log dir never started is not followed unasked (tests/recipes/
    # test_wandb_run_id.py); the user's logging.wandb.run_id is
    assert run_id("from-ckpt", tmp_path, "x", chosen="from-ckpt") == ("from-ckpt", False)
    assert (tmp_path / ID_FILE).read_text().strip() == "from-ckpt"  # ...and is kept for the next restart
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other, new = run_id(None, elsewhere, "tiny cpu/7")
    assert new and other != first  # a fresh run never reuses another run's id


def test_the_plan_logged_is_the_planners_estimate():
    from recipes.parallel.layout import resolve_layout
    from recipes.planner.cost import Assumptions, estimate

    recipe = _recipe()
    layout, _ = resolve_layout(recipe, recipe.cluster.world_size)
    ref = estimate(recipe.model, recipe.cluster, layout, recipe.training.global_batch,
                   precision=recipe.training.precision, assume=Assumptions.for_device(recipe.cluster.device))
    plan = plan_summary(recipe)
    assert plan["layout"] == layout.describe() and plan["time_s"] == ref.time_s and plan["mfu"] == ref.mfu

"""A checkpoint tag as the pre-launch checks read it: the complete.json that recipes.checkpoint.format.tags writes,
with the layout record of a recipe at a given world (recipes.checkpoint.format.layout_record), and the run's
recipe.yaml; no DeepSpeed files. For tests of the refusals that fire before any rank starts (they read the record
only); tests that load a checkpoint make a real one with a run (tests/training/test_init_from.py)."""
from __future__ import annotations

from pathlib import Path

from recipes.checkpoint.format import layout_record
from recipes.checkpoint.format.tags import mark_complete, tag_for
from recipes.checkpoint.recipe_file import write_recipe
from recipes.config.loading import load_recipe
from recipes.parallel.layout import resolve_layout


def recorded_tag(ckpt_dir: Path, config: str, *overrides: str, world: int = 1, step: int = 4) -> Path:
    """`ckpt_dir`/global_step<step>, complete, recording `config` with `overrides` at `world` ranks; returns the tag
    directory."""
    recipe = load_recipe(config, list(overrides))
    layout, problems = resolve_layout(recipe, world)
    assert layout is not None, problems
    tag = tag_for(step)
    (ckpt_dir / tag).mkdir(parents=True)
    mark_complete(ckpt_dir, tag, step, {"step": step, "consumed_samples": step * recipe.training.global_batch},
                  keep_last=2, record=layout_record.record(recipe, layout))
    write_recipe(recipe, ckpt_dir)
    return ckpt_dir / tag

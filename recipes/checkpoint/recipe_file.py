"""The resolved recipe kept beside a checkpoint (checkpoint.dir/recipe.yaml): export, reshape and resume read it, so
they need no --config."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from data_prep.io import atomic_write
from recipes.config.loading import RecipeError, load_recipe

RECIPE_FILE = "recipe.yaml"


def write_recipe(recipe, directory: Path) -> None:
    """DIRECTORY/recipe.yaml: the fully resolved recipe (every default filled in), written atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(str(directory / RECIPE_FILE), yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))


def recipe_digest(recipe) -> str:
    """sha256 of the fully resolved recipe (canonical JSON): which recipe a checkpoint came from, whatever its YAML
    looked like."""
    text = json.dumps(recipe.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def load_checkpoint_recipe(ckpt_dir: str, config: str | None, overrides: list[str]):
    """--config wins; else the recipe.yaml stored next to the checkpoint."""
    if config:
        return load_recipe(config, overrides)
    stored = Path(ckpt_dir) / RECIPE_FILE
    if stored.is_file():
        return load_recipe(str(stored), overrides)
    raise RecipeError(f"{ckpt_dir} holds no {RECIPE_FILE}; pass the recipe the run used with --config RECIPE "
                      "(and the same section.key=value overrides, e.g. model.vocab_size=...)")

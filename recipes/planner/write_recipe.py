"""`recipes plan --write-recipe F`: the recommended layout as a run recipe that launches as written.

The file `extends` what the plan was made from (the source recipe or model preset, and the cluster preset) and holds
only the keys that differ from it: the layout, the token budget, the data, the checkpoint directory and the save
interval (Young/Daly, `recipes.planner.save_interval`), and any overrides given to `plan`. So it diffs cleanly against
its preset, and loading it gives exactly the recipe that was planned (checked before the file is written).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from recipes.config.loading import (
    CONFIGS_DIR, RecipeError, deep_merge, load_recipe, recipe_from_dict, resolve_preset,
)
from recipes.planner.cost import Estimate

RECIPE_SUFFIXES = (".yaml", ".yml", ".json")


def recipe_name(source: str) -> str:
    """The name of a recipe after its file or preset: the whole name, dots included ('models/gpt-1.3b' ->
    'gpt-1.3b'), only a recipe suffix removed."""
    name = Path(source).name
    for ext in RECIPE_SUFFIXES:
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def extends_ref(source: str, out_dir: Path) -> str:
    """How the written recipe names `source` in `extends`: a preset name when it lives under configs/, else a path
    relative to the written file."""
    path = resolve_preset(source).resolve()
    try:
        rel = path.relative_to(CONFIGS_DIR.resolve())
        return str(rel)[: -len(rel.suffix)] if rel.suffix in RECIPE_SUFFIXES else str(rel)
    except ValueError:
        return os.path.relpath(path, out_dir.resolve())


def changed(base: dict, target: dict) -> dict:
    """The keys of `target` whose values differ from `base`, nested mappings compared key by key."""
    out = {}
    for key, value in target.items():
        old = base.get(key, None)
        if isinstance(value, dict) and isinstance(old, dict):
            sub = changed(old, value)
            if sub:
                out[key] = sub
        elif key not in base or old != value:
            out[key] = value
    return out


def with_defaults(base: dict) -> dict:
    """`base` with every schema default filled in, so that a key the planner sets to its default value ("recompute:
    none") is not written as a change. A required key `base` lacks (a model preset has no training.global_batch)
    stays absent, so the written recipe carries it."""
    probe = deep_merge({"training": {"global_batch": 1}}, base)
    try:
        filled = recipe_from_dict(probe).model_dump(mode="json")
    except RecipeError:
        return base
    if "global_batch" not in (base.get("training") or {}):
        del filled["training"]["global_batch"]
    return deep_merge(filled, base)


def layout_keys(rec: Estimate) -> dict:
    """The recommended layout as parallel.* keys, its pipeline schedule and model chunks per rank included."""
    lay = rec.layout
    return {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp, "zero_stage": lay.zero_stage,
            "micro_batch": lay.micro_batch, "sequence_parallel": lay.sequence_parallel, "recompute": lay.recompute,
            "ep": lay.ep, "vpp": lay.vpp, "pipeline_schedule": lay.schedule if lay.pp > 1 else "auto"}


def refuse_existing(out: Path, force: bool) -> None:
    """A recipe already at `out` (hand-written: comments, batch, learning rate) is replaced only with --force."""
    if out.exists() and not force:
        raise RecipeError(f"--write-recipe: {out} already exists; pass --force to replace it, or write to a new path")


def write(out: Path, extends: list[str], base: dict, target: dict, header: str) -> dict:
    """Write `extends` + the keys of `target` that differ from `base` (what `extends` gives) to `out`, after checking
    that loading the file gives the recipe `target` describes. Returns what was written."""
    body = {"name": target.get("name"), "extends": extends,
            **{k: v for k, v in changed(base, target).items() if k != "name"}}
    text = header + yaml.safe_dump(body, sort_keys=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file in the same directory (so `extends` resolves as it will), checked, flushed to disk, then
    # renamed over `out` in one step: a reader sees the old file or the new one, never a part.
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".yaml")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if load_recipe(tmp).model_dump() != recipe_from_dict(target, str(out)).model_dump():
            raise RecipeError(f"{out}: the written recipe would not load as planned (its extends resolve "
                              f"differently from {out.parent}); write it next to the source recipe")
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a recipe is shared like any other config
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return body

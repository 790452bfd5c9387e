"""Check that a launch's world size fits the recipe's parallel layout, before any process starts.

    python launch/layout_check.py [--facts] RECIPE WORLD_SIZE [section.key=value ...]

Prints `TP=.. x PP=.. x DP=..` and exits 0, or exits 3 with the problem and the fix (which counts would work).
--facts prints instead what preflight checks on every node: `device=cuda|cpu`, `checkpoint_dir=DIR`, and one
`data_path=PATH` per manifest / blend prefix.
"""
from __future__ import annotations

import sys

from recipes.config.loading import RecipeError, load_recipe
from recipes.parallel.layout import Layout


def check(recipe_path: str, world_size: int, overrides: list[str]) -> Layout:
    recipe = load_recipe(recipe_path, overrides)
    p = recipe.parallel
    mp = p.tp * p.pp
    where = f"{recipe_path}: parallel.tp={p.tp}, parallel.pp={p.pp}" + (f", parallel.dp={p.dp}" if p.dp else "")
    if world_size % mp:
        fits = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise RecipeError(
            f"{where} needs a world size that is a multiple of tp x pp = {mp}, but the hostfile selection gives "
            f"{world_size} ranks. Fix: launch a multiple of {mp} ranks (--num-nodes/--num-gpus or the hostfile's "
            f"slots), or choose tp x pp from the divisors of {world_size}: {fits} (e.g. parallel.tp=... on the "
            f"command line after --)."
        )
    if p.dp is not None and mp * p.dp != world_size:
        raise RecipeError(
            f"{where}: tp x pp x dp = {mp * p.dp} but the hostfile selection gives {world_size} ranks. "
            f"Fix: launch {mp * p.dp} ranks, or set parallel.dp={world_size // mp} (or drop parallel.dp to derive it)."
        )
    layout = Layout.from_recipe(recipe, world_size=world_size)
    per_step = layout.micro_batch * layout.dp
    if recipe.training.global_batch % per_step:
        raise RecipeError(
            f"{recipe_path}: training.global_batch={recipe.training.global_batch} is not a multiple of "
            f"micro_batch x dp = {layout.micro_batch} x {layout.dp} at world size {world_size}. Fix: set "
            f"training.global_batch to a multiple of {per_step}, or change parallel.micro_batch."
        )
    return layout


def facts(recipe_path: str, overrides: list[str]) -> list[str]:
    recipe = load_recipe(recipe_path, overrides)
    lines = [f"device={recipe.cluster.device}", f"checkpoint_dir={recipe.checkpoint.dir or ''}"]
    lines += [f"data_path={m}" for m in recipe.data.manifests]
    lines += [f"data_path={prefix}" for _, prefix in recipe.data.blend]
    return lines


def main(argv: list[str]) -> int:
    want_facts = bool(argv) and argv[0] == "--facts"
    argv = argv[1:] if want_facts else argv
    if len(argv) < 2 or not argv[1].isdigit():
        print(__doc__, file=sys.stderr)
        return 2
    try:
        layout = check(argv[0], int(argv[1]), argv[2:])
    except RecipeError as e:
        print(f"world size check failed: {e}", file=sys.stderr)
        return 3
    print("\n".join(facts(argv[0], argv[2:])) if want_facts else layout.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Check that a launch's world size fits the recipe's parallel layout, before any process starts.

    python launch/layout_check.py [--facts] RECIPE WORLD_SIZE [section.key=value ...]

Prints `TP=.. x PP=.. x DP=..` and exits 0, or exits 3 with the problem and the fix (which counts would work).
--facts prints instead what preflight checks on every node: `device=cuda|cpu`, `checkpoint_dir=DIR`, one
`data_path=PATH` per manifest / blend prefix, and the recipe's `supervision` settings for train.sh (`max_restarts=N`,
`restart_backoff_seconds=S`, `restart_backoff_max_seconds=S`, `hang_timeout_seconds=S` (0 = off), `straggler_pct=P`).
"""
from __future__ import annotations

import sys

from recipes.config.loading import RecipeError, load_recipe
from recipes.parallel.layout import Layout, resolve_layout


def check(recipe_path: str, world_size: int, overrides: list[str]) -> Layout:
    """The recipe's layout at this launch's world size; RecipeError listing every problem (the rules are Layout's)."""
    recipe = load_recipe(recipe_path, overrides)
    layout, problems = resolve_layout(recipe, world_size, world_source="the hostfile selection")
    if problems:
        raise RecipeError(f"{recipe_path}: " + "\n  ".join(f"{p.message}. Fix: {p.fix}" for p in problems)
                          + "\n(overrides go on the command line after --, e.g. parallel.tp=...)")
    return layout


def facts(recipe_path: str, overrides: list[str]) -> list[str]:
    recipe = load_recipe(recipe_path, overrides)
    lines = [f"device={recipe.cluster.device}", f"checkpoint_dir={recipe.checkpoint.dir or ''}"]
    lines += [f"data_path={m}" for m in recipe.data.manifests]
    lines += [f"data_path={prefix}" for _, prefix in recipe.data.blend]
    sv = recipe.supervision  # what train.sh does on a failure or a hang (its --max-restarts overrides)
    lines += [f"max_restarts={sv.max_restarts}", f"restart_backoff_seconds={sv.restart_backoff_seconds:g}",
              f"restart_backoff_max_seconds={sv.restart_backoff_max_seconds:g}",
              f"hang_timeout_seconds={sv.hang_timeout_seconds or 0:g}", f"straggler_pct={sv.straggler_pct:g}"]
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

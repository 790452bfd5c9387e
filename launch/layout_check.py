"""Before any process starts: does the launch's world size fit the recipe's parallel layout (the rules are
Layout.problems', recipes/parallel/layout.py), and the recipe's facts the launcher acts on (device, checkpoint dir,
data paths, supervision settings, the stop grace). Paths are as the ranks see them: they run in the repository."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launch.common import REPO_DIR, LaunchError
from recipes.config.loading import RecipeError, load_recipe
from recipes.parallel.layout import resolve_layout


@dataclass
class Facts:
    layout: str                      # "TP=.. x PP=.. x DP=.., ZeRO-.."
    device: str = "cpu"
    checkpoint_dir: str = ""         # absolute, "" when the recipe saves nothing
    data_paths: list[str] = field(default_factory=list)
    max_restarts: int = 0
    backoff_s: float = 10.0
    backoff_max_s: float = 300.0
    hang_timeout_s: float = 0.0      # 0: no hang watchdog
    stop_grace_s: float = 60         # a stop's wait for the ranks' save (LAUNCH_STOP_GRACE overrides it)


def _as_ranks_see(path: str) -> str:
    return str(REPO_DIR / path) if path and not Path(path).is_absolute() and "://" not in path else path


def check(recipe_path: str, world_size: int, overrides: list[str]) -> Facts:
    """The recipe's facts at this world size; LaunchError (exit 3) listing every problem with its fix."""
    try:
        recipe = load_recipe(recipe_path, overrides)
    except (RecipeError, ValueError) as e:
        raise LaunchError(f"world size check failed: {e}", 3) from None
    layout, problems = resolve_layout(recipe, world_size, world_source="the hostfile selection")
    if problems:
        raise LaunchError("world size check failed: " + f"{recipe_path}: " + "\n  ".join(
            f"{p.message}. Fix: {p.fix}" for p in problems)
            + "\n(overrides go on the command line after --, e.g. parallel.tp=...)", 3)
    sv = recipe.supervision
    return Facts(layout=layout.describe(), device=recipe.cluster.device,
                 checkpoint_dir=_as_ranks_see(recipe.checkpoint.dir or ""),
                 data_paths=[_as_ranks_see(str(m)) for m in recipe.data.manifests]
                 + [_as_ranks_see(str(prefix)) for _, prefix in recipe.data.blend],
                 max_restarts=sv.max_restarts, backoff_s=sv.restart_backoff_seconds,
                 backoff_max_s=sv.restart_backoff_max_seconds, hang_timeout_s=sv.hang_timeout_seconds or 0,
                 stop_grace_s=recipe.checkpoint.stop_grace_seconds)

"""A finished (or running) training run as the planner reads it: its recipe (RUN_DIR/recipe.yaml, written beside the
checkpoints) and its measured steps (RUN_DIR/logs/metrics.jsonl, recipes.train.metrics), summarised by medians over
the steps after the first (the first pays for start-up: allocation, compilation, caches).

What is read: step_time_s and tokens_per_s; compute_time_max_s (the slowest rank's time outside torch.distributed
calls, recipes.train.stragglers) where logged; pp_blocked_s / pp_bubble (time blocked in pipeline sends and receives,
the measured bubble) where the trainer logs them; moe_load_imbalance for a MoE model.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from recipes.checkpoint.recipe_file import RECIPE_FILE
from recipes.config.loading import RecipeError, load_recipe
from recipes.parallel.layout import Layout

METRICS = Path("logs") / "metrics.jsonl"
WARMUP_RECORDS = 1  # records skipped at the start of a run (and of each resumed attempt: their step restarts)


@dataclass(frozen=True)
class MeasuredRun:
    path: Path
    recipe: object  # recipes.config.schema.Recipe
    layout: Layout
    records: int  # step records the medians are over
    step_time_s: float
    tokens_per_s: float
    compute_s: float | None  # the slowest rank's time outside collectives, per step
    pp_blocked_s: float | None  # time blocked in pipeline sends/receives, per step (the measured bubble)
    moe_load_imbalance: float | None

    @property
    def name(self) -> str:
        return self.path.name


def _records(path: Path) -> list[dict]:
    """The step records of metrics.jsonl (evaluation and other records have no step_time_s), one clear line when a
    line is not JSON."""
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise RecipeError(f"{path}:{i}: not a JSON record ({e.msg}); metrics.jsonl holds one object a line")
        if isinstance(record, dict) and isinstance(record.get("step_time_s"), (int, float)):
            out.append(record)
    return out


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def read_run(run_dir: str | Path) -> MeasuredRun:
    """RUN_DIR's recipe and measured steps; RecipeError naming the file and what to do when either is missing or
    holds too few steps."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RecipeError(f"{path}: not a directory; pass a run's checkpoint.dir (it holds {RECIPE_FILE} and "
                          f"{METRICS})")
    recipe_path, metrics = path / RECIPE_FILE, path / METRICS
    if not recipe_path.is_file():
        raise RecipeError(f"{recipe_path}: missing; a run writes it beside its checkpoints (checkpoint.dir)")
    if not metrics.is_file():
        raise RecipeError(f"{metrics}: missing; the run logged no steps there (logging.dir elsewhere?)")
    recipe = load_recipe(str(recipe_path))
    steps = _records(metrics)
    kept = steps[WARMUP_RECORDS:]
    if not kept:
        raise RecipeError(f"{metrics}: {len(steps)} step record(s); at least {WARMUP_RECORDS + 1} are needed (the "
                          "first is start-up): train a few more steps")
    layout = Layout.from_recipe(recipe)
    blocked = _median(kept, "pp_blocked_s")
    if blocked is None and _median(kept, "pp_bubble") is not None:
        blocked = _median(kept, "pp_bubble") * _median(kept, "step_time_s")
    return MeasuredRun(path=path, recipe=recipe, layout=layout, records=len(kept),
                       step_time_s=_median(kept, "step_time_s"), tokens_per_s=_median(kept, "tokens_per_s"),
                       compute_s=_median(kept, "compute_time_max_s"), pp_blocked_s=blocked,
                       moe_load_imbalance=_median(kept, "moe_load_imbalance"))

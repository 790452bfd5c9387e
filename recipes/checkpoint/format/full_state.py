"""The full state directory: one checkpoint's state independent of any layout, the interchange between reading a
checkpoint (recipes.checkpoint.format.read), HF import and writing it again at another layout.

  weights.safetensors      canonical names (see recipes.checkpoint.format.shards), fp32, vocabulary unpadded
  exp_avg.safetensors      Adam first moments, same names/shapes (optional: absent = fresh optimizer)
  exp_avg_sq.safetensors   Adam second moments (with exp_avg)
  meta.json                client_state (step, consumed_samples, ...), optimizer_step, param_group_lrs,
                           lr_scheduler state, source_layout
  recipe.yaml              the full recipe at the target layout (parallel.tp/pp/dp/zero_stage)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from recipes.checkpoint.recipe_file import write_recipe

WEIGHTS, EXP_AVG, EXP_AVG_SQ, META = "weights.safetensors", "exp_avg.safetensors", "exp_avg_sq.safetensors", "meta.json"


def save_full_state(out: Path, weights: dict, meta: dict, recipe, exp_avg: dict | None = None,
                    exp_avg_sq: dict | None = None) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / WEIGHTS))
    if exp_avg is not None:
        save_file({k: v.contiguous() for k, v in exp_avg.items()}, str(out / EXP_AVG))
        save_file({k: v.contiguous() for k, v in exp_avg_sq.items()}, str(out / EXP_AVG_SQ))
    write_recipe(recipe, out)
    (out / META).write_text(json.dumps(meta, indent=1))


@dataclass
class OpenFullState:
    """A full state directory opened for reading tensor by tensor (safetensors: data only, memory-mapped)."""

    weights: object  # safetensors safe_open handles: get_tensor(name)
    moments: tuple | None  # (exp_avg, exp_avg_sq) handles, or None for a fresh optimizer
    meta: dict


def open_full_state(state_dir: Path) -> OpenFullState:
    from safetensors import safe_open

    moments = None
    if (state_dir / EXP_AVG).is_file():
        moments = (safe_open(str(state_dir / EXP_AVG), "pt"), safe_open(str(state_dir / EXP_AVG_SQ), "pt"))
    return OpenFullState(weights=safe_open(str(state_dir / WEIGHTS), "pt"), moments=moments,
                         meta=json.loads((state_dir / META).read_text()))

"""Where a run starts: the training state (step, samples consumed, skipped steps) from the newest complete checkpoint
of checkpoint.dir (checkpoint.auto_resume), or from the beginning. The engine's weights, optimizer, lr schedule and
RNG states are loaded with it (recipes.checkpoint.store.resume)."""
from __future__ import annotations

from dataclasses import dataclass

from recipes.checkpoint import store


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    consumed_samples: int = 0  # sequences consumed from the training data
    nan_skips_total: int = 0  # steps skipped for a non-finite loss or gradient
    resumed_from: int | None = None  # the step this run resumed from (None: a fresh start)

    def client_state(self) -> dict:
        """What a checkpoint keeps of it (complete.json and DeepSpeed's client state)."""
        return {"step": self.step, "consumed_samples": self.consumed_samples, "nan_skips_total": self.nan_skips_total}


def resume(engine, recipe) -> TrainState:
    """Collective: load the newest complete checkpoint into `engine` (a DeepSpeed engine) if there is one."""
    saved = store.resume(engine, recipe.checkpoint.dir) if recipe.checkpoint.auto_resume else None
    if not saved:
        return TrainState()
    return TrainState(step=saved["step"], consumed_samples=saved["consumed_samples"],
                      nan_skips_total=saved.get("nan_skips_total", 0), resumed_from=saved["step"])

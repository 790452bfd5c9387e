"""Where a run starts: the training state (step, samples consumed, skipped steps) from the newest complete checkpoint
of checkpoint.dir (checkpoint.auto_resume), else from another run's checkpoint (checkpoint.init_from: its weights,
and optionally its optimizer state, at this run's layout, with the step and samples at zero), else from the
beginning. The engine's weights, optimizer, lr schedule and RNG states are loaded with it: by DeepSpeed when the tag
was saved at this layout (recipes.checkpoint.store.load), else resharded on load (recipes.checkpoint.reshard); from
another run by recipes.checkpoint.init_from.initialise."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from recipes.checkpoint import init_from, reshard, store
from recipes.checkpoint.format.layout_record import saved_layout

logger = logging.getLogger(__name__)


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    consumed_samples: int = 0  # sequences consumed from the training data
    nan_skips_total: int = 0  # steps skipped for a non-finite loss or gradient
    resumed_from: int | None = None  # the step this run resumed from (None: a fresh start)
    init_from: dict | None = None  # the run this one started from (dir, tag, step, layout, ...), in every checkpoint
    wandb_run_id: str | None = None  # the W&B run of this training run (rank 0; recipes.train.tracking)

    def client_state(self) -> dict:
        """What a checkpoint keeps of it (complete.json and DeepSpeed's client state)."""
        kept = {"step": self.step, "consumed_samples": self.consumed_samples, "nan_skips_total": self.nan_skips_total}
        if self.init_from is not None:
            kept["init_from"] = self.init_from
        if self.wandb_run_id:
            kept["wandb_run_id"] = self.wandb_run_id
        return kept

    @property
    def initialised_here(self) -> bool:
        """Started from another run's checkpoint just now (not resumed from one of its own)."""
        return self.init_from is not None and self.resumed_from is None


def _resume_own(eng, recipe) -> dict | None:
    """Collective: the newest complete tag of checkpoint.dir, loaded by DeepSpeed when saved at this layout, else
    resharded on load (recipes.checkpoint.reshard). Its client state, or None (nothing to resume)."""
    from megatron.core import parallel_state

    tag_dir = store.newest_agreed(recipe.checkpoint.dir)
    if tag_dir is None:
        return None
    t0 = time.perf_counter()
    if reshard.loads_as_saved(tag_dir, recipe, eng.layout):
        how, state = "as saved", store.load(eng.engine, tag_dir)
    else:
        saved = saved_layout(tag_dir)
        logger.info(f"checkpoint: {tag_dir} was saved at {saved.describe()}; resharding it on load to "
                    f"{eng.layout.describe()} (the checkpoint is only read; the next save writes this layout)")
        how, state = "resharded", reshard.load_resharded(eng, recipe, tag_dir,
                                                         parallel_state.get_tensor_model_parallel_rank(),
                                                         parallel_state.get_expert_model_parallel_rank())
    torch.distributed.barrier()  # every rank loaded: the time is the slowest rank's
    logger.info(f"checkpoint: resumed from {tag_dir} at step {state['step']}, {state['consumed_samples']} samples "
                f"consumed; loaded {how} in {time.perf_counter() - t0:.2f} s")
    return state


def resume(eng, recipe) -> TrainState:
    """Collective: load the newest complete checkpoint into `eng` (recipes.train.engine.Engine) if there is one, else
    initialise it from checkpoint.init_from if set."""
    saved = _resume_own(eng, recipe) if recipe.checkpoint.auto_resume else None
    if saved:
        if recipe.checkpoint.init_from is not None:
            logger.info(f"checkpoint.dir {recipe.checkpoint.dir} holds this run's own checkpoint (step {saved['step']}):"
                        f" resuming it; checkpoint.init_from ({recipe.checkpoint.init_from.dir}) is not read again")
        return TrainState(step=saved["step"], consumed_samples=saved["consumed_samples"],
                          nan_skips_total=saved.get("nan_skips_total", 0), resumed_from=saved["step"],
                          init_from=saved.get("init_from"), wandb_run_id=saved.get("wandb_run_id"))
    if recipe.checkpoint.init_from is None:
        return TrainState()
    from megatron.core import parallel_state

    source = init_from.initialise(eng, recipe, parallel_state.get_tensor_model_parallel_rank(),
                                  parallel_state.get_expert_model_parallel_rank())
    what = "weights and optimizer state" if source["optimizer"] else "weights"
    logger.info(f"initialised from {source['dir']}/{source['tag']} (step {source['step']} of "
                f"{(source['recipe'] or {}).get('name', 'an unnamed recipe')}): its {what} at this run's layout; "
                "step, consumed samples and the lr schedule start at 0")
    return TrainState(init_from=source)

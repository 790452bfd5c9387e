"""Experiment tracking (Weights & Biases): one W&B run per training run, written by global rank 0 only.

The W&B run id belongs to the training run, not to a process: it is kept in every checkpoint's client state
(`TRACKING_ID_KEY`, in complete.json and DeepSpeed's client state), so a `--max-restarts` restart, a Slurm requeue or
any later run that resumes from that checkpoint logs into the same W&B run (`resume="allow"`). Before the first
checkpoint exists it is kept in `<logging dir>/wandb_run_id`, so a crash before the first save resumes it too.

The recipe and the planner's estimate for the run's layout are logged once, when the W&B run is created; the metrics
are the records of metrics.jsonl (recipes.train.metrics), step for step.
"""
from __future__ import annotations

import logging
import os
import re
import secrets
from pathlib import Path

logger = logging.getLogger(__name__)

TRACKING_ID_KEY = "wandb_run_id"
ID_FILE = "wandb_run_id"
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what W&B accepts as a run id


def run_id(saved: str | None, log_dir: Path, recipe_name: str, chosen: str | None = None) -> tuple[str, bool]:
    """(the W&B run id of this training run, whether it is new). `saved`: the id in the checkpoint resumed from;
    `chosen`: logging.wandb.run_id, the user's explicit choice.

    A checkpoint's id is taken only when this run's log dir started or adopted that W&B run (its wandb_run_id file
    names it): a restart, a requeue, a relaunch of the same run. A checkpoint brought from elsewhere names a W&B run
    its log dir never had: appending to it (someone else's run, if the key reaches it) is not done unasked; a new W&B
    run starts, and the log says how to continue the old one (logging.wandb.run_id=ID)."""
    id_file = log_dir / ID_FILE
    mine = id_file.read_text().strip() if id_file.is_file() else None
    mine = mine if mine and _ID.match(mine) else None
    if chosen:
        found, new = chosen, False
    elif saved and saved == mine or (mine and not saved):
        found, new = mine, False
    else:
        if saved:
            logger.warning(f"wandb: the checkpoint resumed from names W&B run {saved}, which this run's log dir "
                           f"({log_dir}) never started: a new W&B run is started; to log into {saved} instead, set "
                           f"logging.wandb.run_id={saved}")
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", recipe_name).strip("-")[:40] or "run"
        found, new = f"{slug}-{secrets.token_hex(4)}", True  # a fresh run in a reused dir must not append to an old one
    id_file.write_text(found + "\n")
    return found, new


def plan_summary(recipe) -> dict:
    """The planner's estimate for the recipe's own layout (memory per GPU, step time, MFU), or why there is none."""
    from recipes.parallel.layout import resolve_layout
    from recipes.planner.cost import Assumptions, estimate, layout_problems

    t, cl = recipe.training, recipe.cluster
    try:
        layout, _ = resolve_layout(recipe, cl.world_size)
    except ValueError as e:
        return {"note": f"no layout: {e}"}
    problems = layout_problems(recipe.model, cl, layout, t.global_batch)
    if problems:
        return {"layout": layout.describe(), "note": "; ".join(problems)}
    est = estimate(recipe.model, cl, layout, t.global_batch, precision=t.precision,
                   assume=Assumptions.for_device(cl.device))
    return {"layout": layout.describe(), "memory_gib": est.memory_gib, "time_s": est.time_s,
            "tokens_per_s": est.tokens_per_s, "tflops_per_gpu": est.tflops_per_gpu, "mfu": est.mfu}


class WandbSink:
    """A metrics sink (recipes.train.metrics.MetricsSink) into the training run's W&B run."""

    def __init__(self, recipe, log_dir: Path, wandb_id: str, new: bool):
        import wandb  # optional (pip install .[wandb]); recipes.planner.validation refuses the recipe without it

        w = recipe.logging.wandb
        config = {"recipe": recipe.model_dump(mode="json"), "plan": plan_summary(recipe)} if new else None
        self.run = wandb.init(project=w.project, entity=w.entity, group=w.group, tags=w.tags or None,
                              name=w.name or recipe.name, mode=w.mode, id=wandb_id, resume="allow", config=config,
                              dir=os.environ.get("WANDB_DIR") or str(log_dir))  # default: beside metrics.jsonl
        logger.info(f"wandb: run {wandb_id} ({'new' if new else 'resumed'}), project {w.project}")

    def write(self, record: dict, step: int) -> None:
        self.run.log(record, step=step)

    def close(self) -> None:
        self.run.finish()


def tracking_sinks(recipe, log_dir: Path, saved_id: str | None) -> tuple[list, str | None]:
    """(the tracker sinks the recipe configures, the W&B run id to keep in checkpoints); rank 0 only."""
    if recipe.logging.wandb is None:
        return [], None
    wandb_id, new = run_id(saved_id, log_dir, recipe.name, recipe.logging.wandb.run_id)
    return [WandbSink(recipe, log_dir, wandb_id, new)], wandb_id

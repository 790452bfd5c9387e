"""The training run, top to bottom: build -> resume -> for each step: train, log, validate, save / evaluate / stop
-> done. Each part is a component with one job:

  build        the run's directories, parallel state and seeds, datasets and micro-batch streams (engine: engine.py)
  resume       the training state from the newest complete checkpoint
  step         one optimizer step (forward/backward, the optimizer's outcome) and the NaN policy
  validate     the validation loss every training.eval_interval steps
  policy       when to save, evaluate and stop (rules only); checkpoints carries them out
  metrics      records into the sinks (metrics.jsonl, TensorBoard), the progress bar or one line per log interval
  tracking     the W&B run (rank 0), resumed across restarts: its id kept in the checkpoints
  stragglers   per-rank time outside the collectives; the slowest rank named

Run by every rank (see `recipes.train.cli` for the entry point). Collective calls happen on all ranks in the same
order; only global rank 0 writes logs.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from recipes.checkpoint import shm_writer
from recipes.checkpoint.lease import Lease
from recipes.checkpoint.recipe_file import write_recipe
from recipes.config.stages import stage_at
from recipes.train.build import build_data, parallel_state_and_seeds, run_dirs
from recipes.train.checkpoints import RunCheckpoints
from recipes.train.engine import init_distributed, initialize, shutdown_distributed
from recipes.train.evaluation import BackgroundEval
from recipes.train.expert_parallel import update_expert_biases
from recipes.train.faults import Fault, LayerDelays
from recipes.train.heartbeat import Heartbeat
from recipes.train.metrics import (StepFigures, build_metrics_log, moe_routing, mtp_figures, pipeline_figures,
                                   progress)
from recipes.train.resume import resume
from recipes.train.signals import StopRequest
from recipes.train.step import NanPolicy, StepResult, loss_scale, outcome, train_step
from recipes.train.stragglers import COMM_CLOCK, StragglerReport
from recipes.train.tracking import tracking_sinks
from recipes.train.validate import Validator

logger = logging.getLogger(__name__)


def run(recipe, quiet: bool = False) -> int:
    """Train `recipe` on this rank. Returns the exit code (0 done or stopped cleanly)."""
    if recipe.checkpoint.dir and recipe.checkpoint.async_save:
        shm_writer.prefork()  # first: before any thread (the heartbeat's) or the model exists
    heartbeat = Heartbeat.from_env()  # before the rendezvous: a rank stuck there shows as phase "start"
    COMM_CLOCK.install()  # before DeepSpeed binds torch.distributed's calls (recipes.train.stragglers)
    device = init_distributed(recipe)
    lease = None
    if torch.distributed.get_rank() == 0 and recipe.checkpoint.dir:
        lease = Lease(recipe.checkpoint.dir).acquire()  # one run per checkpoint.dir, before anything is written
    try:
        return Trainer(recipe, device, quiet, lease, heartbeat).train()
    finally:
        if lease:
            lease.release()


class Trainer:
    def __init__(self, recipe, device: torch.device, quiet: bool, lease, heartbeat: Heartbeat):
        t = recipe.training
        self.recipe, self.device, self.heartbeat = recipe, device, heartbeat
        self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.layout = parallel_state_and_seeds(recipe, device)
        self.dirs = run_dirs(recipe)
        self.log = build_metrics_log(recipe, self.dirs.logs, enabled=self.rank == 0, quiet=quiet)
        if self.rank == 0 and self.dirs.checkpoint:
            write_recipe(recipe, Path(self.dirs.checkpoint))
        heartbeat.beat(0, "setup")
        self.fault = Fault.from_env()  # tests only (recipes.train.faults)
        self.stragglers = StragglerReport(recipe.supervision.straggler_pct, self.world, device,
                                          ranks_per_stage=self.world // self.layout.pp)
        self.total_steps = t.steps(recipe.model.seq_length)
        self.log.say(f"layout: {self.layout.describe()}, {self.layout.grad_accum_steps(t.global_batch)} micro-batches "
                     f"per step, {self.total_steps} steps, device {device}")
        self.data = build_data(recipe, self.layout, device, self.total_steps, self.dirs.data_cache)
        heartbeat.beat(0, "engine-setup")
        self.eng = initialize(recipe, self.layout, device, self.total_steps)
        if self.fault:
            self.fault.attach(self.eng.module)
        LayerDelays.from_env().attach(self.eng.module)  # tests only: fixed compute time per layer
        heartbeat.beat(0, "resume")
        self.state = resume(self.eng, recipe)
        if self.rank == 0:  # the tracker resumes the run the checkpoint names
            sinks, self.state.wandb_run_id = tracking_sinks(recipe, self.dirs.logs, self.state.wandb_run_id)
            self.log.add(sinks)
        self.nan = NanPolicy(t.max_consecutive_nan_skips, self.state.nan_skips_total)
        self.figures = StepFigures(recipe, self.world, device)
        self.validator = Validator(self.eng, self.data.valid, self.data.eval_iters, t.eval_interval, t.global_batch)
        self.stop = StopRequest()
        self.evaluation = BackgroundEval(recipe, self.dirs.checkpoint, self.dirs.logs, enabled=self.rank == 0)
        self.progress = progress(self.rank == 0 and not quiet, self.total_steps, self.state.step)
        self.checkpoints = RunCheckpoints(recipe, self.eng, device, self.total_steps, self.evaluation, lease, heartbeat)
        if self.state.initialised_here:  # its own step-0 checkpoint: a restart resumes it, never the source again
            self.checkpoints.save_now(0, self.state.client_state())
        self.log.write(self.layout_record(), self.state.step)

    def layout_record(self) -> dict:
        """Where a run (or its restart) starts, and at which layout: metrics.jsonl shows a change of world (elastic
        restarts, a relaunch at another layout) at the step it took effect."""
        t = self.recipe.training
        return {"step": self.state.step, "layout": self.layout.describe(), "world_size": self.world,
                "micro_batches_per_step": self.layout.grad_accum_steps(t.global_batch),
                "tokens_per_step": t.global_batch * self.recipe.model.seq_length}

    def train(self) -> int:
        try:
            while self.state.step < self.total_steps:
                result = self.train_step()
                self.log_step(result)
                self.validate()
                self.heartbeat.beat(self.state.step, "sync")
                stopping = self.stop.agreed(self.device)
                if self.checkpoints.after_step(self.state.step, self.state.client_state(), stopping):
                    logger.info(f"stopped by signal after step {self.state.step}; resume with the same command")
                    break
            self.finish()
        finally:
            self.checkpoints.abandon()  # an error on the way: stop the writer now (a no-op after finish)
        shutdown_distributed()
        self.evaluation.wait()  # rank 0: the last scores belong to the run (after the barrier: others need not wait)
        return 0

    def train_step(self) -> StepResult:
        """One optimizer step, timed: wall time, and time outside the collectives (the straggler report)."""
        s, eng = self.state, self.eng
        self.announce_stage(s.step)
        lr = eng.optimizer.param_groups[0]["lr"]
        eng.optimizer.last_skipped = False  # ZeRO-1/2 may skip before our optimizer is even called
        self.heartbeat.beat(s.step, "data")
        if self.fault:
            self.fault.maybe_fire(self.rank, s.step + 1)
        COMM_CLOCK.start(self.device)
        start = time.perf_counter()
        mbs = self.data.train.step(s.consumed_samples)
        self.heartbeat.beat(s.step, "forward-backward")
        loss = train_step(eng, mbs)
        update_expert_biases(eng, self.recipe)  # MoE with model.moe.expert_bias only (aux-loss-free balancing)
        elapsed = time.perf_counter() - start
        self.stragglers.add(elapsed - COMM_CLOCK.stop())
        s.step += 1
        s.consumed_samples += self.recipe.training.global_batch
        self.heartbeat.beat(s.step, "log", elapsed)
        result = outcome(eng, StepResult(step=s.step, loss=loss, lr=lr, seconds=elapsed))
        self.nan.observe(result)
        s.nan_skips_total = self.nan.total
        return result

    def log_step(self, result: StepResult) -> None:
        """The step's record (every log_interval steps and every skipped step), the progress bar, the NaN policy."""
        record = self.figures.record(result, self.state, loss_scale(self.eng))
        stage = self.stage(result.step - 1)
        if stage is not None:  # the report draws the stage boundaries from this
            record["stage"] = stage.name
        interval = result.step % self.recipe.training.log_interval == 0
        if interval:  # every rank, the same steps: a collective
            record.update(self.stragglers.gather())
            record.update(moe_routing(self.eng, self.recipe))  # MoE only: tokens per expert, drops, aux loss
            record.update(mtp_figures(self.eng, self.recipe))  # model.mtp only: each depth's loss
            record.update(pipeline_figures(self.eng, self.recipe))  # PP only: measured and predicted bubble
        if interval or result.skipped:
            self.log.write(record, result.step)
        self.progress.update(record, interval)
        self.nan.check(result)

    def validate(self) -> None:
        step = self.state.step
        if not self.validator.due(step):
            return
        self.heartbeat.beat(step, "eval")
        record = self.validator.run(step)
        self.log.write(record, step)
        self.log.say(f"step {step}: validation loss {record['val_loss']:.4f}, perplexity {record['val_ppl']:.2f}")

    def stage(self, step_index: int):
        """The data stage of a 0-based step index (None without stages)."""
        return stage_at(self.data.plan, step_index) if self.data.plan else None

    def announce_stage(self, step_index: int) -> None:
        stage, plan = self.stage(step_index), self.data.plan
        if stage is not None and step_index in (stage.start, self.state.resumed_from):
            self.log.say(f"step {step_index + 1}: data stage {stage.name} ({stage.index + 1}/{len(plan)}, steps "
                         f"{stage.start + 1}-{stage.end})")

    def finish(self) -> None:
        s = self.state
        self.heartbeat.beat(s.step, "done")
        self.progress.close()
        self.log.say(f"done: step {s.step}/{self.total_steps}, {s.consumed_samples} samples, {s.nan_skips_total} "
                     "skipped steps")
        self.log.close()
        self.checkpoints.close()

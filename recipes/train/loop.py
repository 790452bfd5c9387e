"""The training loop, top to bottom: set up -> resume -> for each step: train, log, evaluate, save -> done.

Run by every rank (see `recipes.train.cli` for the entry point). Collective calls happen on all ranks in the same
order; only global rank 0 writes logs.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import resource
import sys
import time
from functools import partial
from pathlib import Path

import torch

from recipes.checkpoint import store as checkpoint
from recipes.checkpoint.lease import Lease
from recipes.checkpoint.recipe_file import write_recipe
from recipes.config.stages import stage_at, stage_plan
from recipes.train.data import MicroBatches, build_datasets
from recipes.train.stages import build_stage_datasets
from recipes.train.evaluation import BackgroundEval
from recipes.train import signals
from recipes.train.faults import Fault
from recipes.train.heartbeat import Heartbeat
from recipes.train.engine import init_distributed, init_parallel_state, initialize, shutdown_distributed
from recipes.train.expert_parallel import routing_stats
from recipes.model.shape import model_flops_per_step
from recipes.parallel.layout import Layout

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------------------- metrics
class MetricsLog:
    """metrics.jsonl + TensorBoard (+ wandb when logging.wandb_project is set), written by global rank 0 only."""

    def __init__(self, recipe, log_dir: Path, enabled: bool, quiet: bool):
        self.enabled, self.quiet = enabled, quiet
        self.tb = self.wandb = self.file = None
        if not enabled:
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        self.file = open(log_dir / "metrics.jsonl", "a")
        if recipe.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(log_dir / "tensorboard"))
        if recipe.logging.wandb_project:
            try:
                import wandb  # optional dependency: only imported when configured
            except ImportError:
                raise RuntimeError("logging.wandb_project is set but wandb is not installed: pip install wandb, "
                                   "or remove logging.wandb_project (TensorBoard and metrics.jsonl need nothing)")

            self.wandb = wandb.init(project=recipe.logging.wandb_project, name=recipe.name,
                                    config=recipe.model_dump(), dir=str(log_dir))

    def write(self, record: dict, step: int) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        for k, v in record.items():
            if k != "step" and isinstance(v, (int, float)) and self.tb is not None:
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(record, step=step)

    def say(self, text: str) -> None:
        """Progress lines on rank 0's stdout (events such as resume, skips and stop go to the log, which --quiet
        does not hide)."""
        if self.enabled and not self.quiet:
            print(text, flush=True)

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # peak RSS (KiB on Linux)


# ------------------------------------------------------------------------------------------------------ signals
class StopRequest:
    """SIGTERM / SIGUSR1 (pre-emption) ask for a checkpoint and a clean exit at the end of the current step."""

    def __init__(self):
        signals.install()  # already installed by the entry point; again for callers that start here

    @property
    def flag(self) -> bool:
        return signals.requested()

    def agreed(self, device) -> bool:
        """Collective: stop if any rank got the signal."""
        t = torch.tensor([1.0 if self.flag else 0.0], device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())


# ------------------------------------------------------------------------------------------------------ stragglers
class StepTimes:
    """Per-rank step times, gathered across ranks at the log interval only (one float per rank: no collective per
    step for this): p50/p90/max over ranks for the metrics, and the slowest rank named when it lags the median by
    more than supervision.straggler_pct."""

    def __init__(self, straggler_pct: float, world: int):
        self.pct, self.world, self.times, self.hosts = straggler_pct, world, [], None
        if world > 1:  # once at start: which host each rank is on, for the log line
            import os
            import socket

            self.hosts = [None] * world
            torch.distributed.all_gather_object(self.hosts, os.environ.get("LAUNCH_HOST", socket.gethostname()))

    def add(self, seconds: float) -> None:
        self.times.append(seconds)

    def gather(self, device) -> dict:
        """Collective (every rank, same steps). Returns the metrics fields; logs a straggler on rank 0."""
        mine = sum(self.times) / max(len(self.times), 1)
        self.times = []
        if self.world == 1:
            return {}
        t = torch.tensor([mine], dtype=torch.float64, device=device)
        out = [torch.empty_like(t) for _ in range(self.world)]
        torch.distributed.all_gather(out, t)  # (gloo has no all_gather_into_tensor)
        per_rank = [float(x) for x in out]
        ranked = sorted(per_rank)
        p50, p90 = _nearest_rank(ranked, 0.5), _nearest_rank(ranked, 0.9)
        slowest = max(range(self.world), key=per_rank.__getitem__)
        fields = {"step_time_p50_s": p50, "step_time_p90_s": p90, "step_time_max_s": ranked[-1],
                  "slowest_rank": slowest}
        if torch.distributed.get_rank() == 0 and p50 > 0 and ranked[-1] > p50 * (1 + self.pct / 100):
            logger.warning(f"straggler: rank {slowest} on host {self.hosts[slowest]} takes {ranked[-1]:.3f} s per "
                           f"step, {100 * (ranked[-1] / p50 - 1):.0f}% above the median {p50:.3f} s "
                           f"(supervision.straggler_pct = {self.pct:g})")
        return fields


def _nearest_rank(ranked: list[float], q: float) -> float:
    return ranked[min(len(ranked) - 1, max(0, math.ceil(q * len(ranked)) - 1))]


# ---------------------------------------------------------------------------------------------------------- steps
def train_step(eng, micro_batches) -> float:
    """One optimizer step over this rank's micro-batches; returns the mean loss over the global batch."""
    if eng.is_pipe:
        return float(eng.engine.train_batch(data_iter=iter(micro_batches)))
    from megatron.core import parallel_state

    total = torch.zeros((), device=eng.device)
    n = 0
    for inputs, (labels, mask) in micro_batches:  # inputs: tokens, or (tokens, position_ids) (document mask)
        loss = eng.engine(inputs, labels, mask)
        eng.engine.backward(loss)
        eng.engine.step()
        total += loss.detach().float()
        n += 1
    total /= n
    torch.distributed.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return float(total) / parallel_state.get_data_parallel_world_size()


@torch.no_grad()
def eval_loss(eng, batches: MicroBatches, iters: int, global_batch: int) -> float:
    """Mean validation loss over `iters` global batches from the start of the validation split."""
    from megatron.core import parallel_state

    losses = []
    for i in range(iters):
        mbs = batches.step(i * global_batch)
        if eng.is_pipe:
            losses.append(float(eng.engine.eval_batch(data_iter=iter(mbs))))
            continue
        eng.engine.eval()
        total = torch.zeros((), device=eng.device)
        n = 0
        for inputs, (labels, mask) in mbs:
            total += eng.engine(inputs, labels, mask).float()
            n += 1
        eng.engine.train()
        torch.distributed.all_reduce(total, group=parallel_state.get_data_parallel_group())
        losses.append(float(total) / n / parallel_state.get_data_parallel_world_size())
    return sum(losses) / len(losses)


# ------------------------------------------------------------------------------------------------------------ run
def run(recipe, quiet: bool = False) -> int:
    """Train `recipe` on this rank. Returns the exit code (0 done or stopped cleanly)."""
    heartbeat = Heartbeat.from_env()  # before the rendezvous: a rank stuck there shows as phase "start"
    device = init_distributed(recipe)
    lease = None
    if torch.distributed.get_rank() == 0 and recipe.checkpoint.dir:
        lease = Lease(recipe.checkpoint.dir).acquire()  # one run per checkpoint.dir, before anything is written
    try:
        return _run(recipe, device, quiet, lease, heartbeat)
    finally:
        if lease:
            lease.release()


def _run(recipe, device, quiet: bool, lease, heartbeat: Heartbeat) -> int:
    t = recipe.training
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    layout = Layout.from_recipe(recipe, world)
    init_parallel_state(layout)
    torch.manual_seed(t.seed)

    from megatron.core import parallel_state, tensor_parallel

    if device.type == "cuda":  # megatron-core's CUDA RNG tracker (TP-aware streams) wants its seeds set
        tensor_parallel.model_parallel_cuda_manual_seed(t.seed)

    ckpt_dir = recipe.checkpoint.dir
    log_dir = Path(recipe.logging.dir or (Path(ckpt_dir) / "logs" if ckpt_dir else "runs/logs"))
    cache_dir = recipe.data.cache_dir or str(Path(ckpt_dir or "runs") / "data_cache")
    log = MetricsLog(recipe, log_dir, enabled=rank == 0, quiet=quiet)
    if rank == 0 and ckpt_dir:
        write_recipe(recipe, Path(ckpt_dir))
    say = log.say

    heartbeat.beat(0, "setup")
    fault = Fault.from_env()  # tests only (recipes.train.faults)
    step_times = StepTimes(recipe.supervision.straggler_pct, world)
    total_steps = t.steps(recipe.model.seq_length)
    grad_accum = layout.grad_accum_steps(t.global_batch)
    say(f"layout: {layout.describe()}, {grad_accum} micro-batches per step, {total_steps} steps, device {device}")

    eval_iters = t.eval_iters if total_steps >= t.eval_interval else 0
    plan = stage_plan(recipe)
    if plan:
        train_ds, valid_ds, plan = build_stage_datasets(recipe, max(eval_iters, 1) * t.global_batch, cache_dir)
    else:
        train_ds, valid_ds = build_datasets(recipe, total_steps * t.global_batch,
                                            max(eval_iters, 1) * t.global_batch, cache_dir)
    dp_rank = parallel_state.get_data_parallel_rank()
    batches = partial(MicroBatches, micro_batch=layout.micro_batch, grad_accum=grad_accum, dp_rank=dp_rank,
                      dp_size=layout.dp, device=device, positions=recipe.model.document_mask,
                      num_workers=recipe.data.num_workers)
    train_batches = batches(train_ds)
    valid_batches = batches(valid_ds) if valid_ds else None

    heartbeat.beat(0, "engine-setup")
    eng = initialize(recipe, layout, device, total_steps)
    heartbeat.beat(0, "resume")
    state = checkpoint.resume(eng.engine, ckpt_dir) if recipe.checkpoint.auto_resume else None
    step = state["step"] if state else 0
    consumed = state["consumed_samples"] if state else 0
    nan_skips_total = state.get("nan_skips_total", 0) if state else 0

    flops = model_flops_per_step(recipe.model, recipe.training.global_batch)
    tokens_per_step = t.global_batch * recipe.model.seq_length
    stop = StopRequest()
    evaluation = BackgroundEval(recipe, ckpt_dir, log_dir, enabled=rank == 0)
    consecutive_skips = 0
    progress = None
    redirect = contextlib.ExitStack()
    if rank == 0 and not quiet:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        progress = tqdm(total=total_steps, initial=step, desc="train", unit="step", file=sys.stderr)
        # log lines (saves, skips) above the bar instead of glued to its end
        redirect.enter_context(logging_redirect_tqdm([logging.getLogger("recipes")]))

    saver = checkpoint.Checkpointer(eng.engine, ckpt_dir, recipe.checkpoint.keep_last,
                                    background=recipe.checkpoint.async_save, device=device,
                                    max_mib_per_s=recipe.checkpoint.async_max_mib_per_s) if ckpt_dir else None
    eval_pending = None  # a step whose checkpoint the evaluation waits for (an async save completes later)

    def save_now(capped: bool = True):
        cs = {"step": step, "consumed_samples": consumed, "nan_skips_total": nan_skips_total}
        if lease:
            lease.check()
        heartbeat.beat(step, "save")
        saver.save(step, cs, capped=capped)

    try:
        while step < total_steps:
            stage = stage_at(plan, step) if plan else None
            if stage is not None and (step == stage.start or step == (state or {}).get("step")):
                say(f"step {step + 1}: data stage {stage.name} ({stage.index + 1}/{len(plan)}, steps {stage.start + 1}-"
                    f"{stage.end})")
            lr = eng.optimizer.param_groups[0]["lr"]
            eng.optimizer.last_skipped = False  # ZeRO-1/2 may skip before our optimizer is even called
            heartbeat.beat(step, "data")
            if fault:
                fault.maybe_fire(rank, step + 1)
            start = time.perf_counter()
            mbs = train_batches.step(consumed)
            heartbeat.beat(step, "forward-backward")
            loss = train_step(eng, mbs)
            elapsed = time.perf_counter() - start
            step += 1
            heartbeat.beat(step, "log", elapsed)
            step_times.add(elapsed)
            consumed += t.global_batch

            grad_norm = eng.engine.get_global_grad_norm()  # None where DeepSpeed keeps no norm (ZeRO-0 without fp16)
            grad_norm = float(grad_norm) if grad_norm is not None else None
            bad_norm = grad_norm is not None and not math.isfinite(grad_norm)
            skipped = (not math.isfinite(loss)) or eng.optimizer.last_skipped or bad_norm
            if skipped:
                nan_skips_total += 1
                consecutive_skips += 1
            else:
                consecutive_skips = 0
            tflops = flops / elapsed / world / 1e12
            record = {
                "step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "loss_scale": _loss_scale(eng),
                "tokens_per_s": tokens_per_step / elapsed, "tflops_per_gpu": tflops,
                "mfu": tflops / recipe.cluster.peak_tflops, "mem_gb": _memory_gb(device), "step_time_s": elapsed,
                "consumed_samples": consumed, "skipped": skipped, "nan_skips_total": nan_skips_total,
            }
            if stage is not None:  # the report draws the stage boundaries from this
                record["stage"] = stage.name
            if step % t.log_interval == 0:  # every rank, the same steps: a collective
                record.update(step_times.gather(device))
                record.update(routing_stats(eng, recipe))  # MoE only: tokens per expert, dropped, aux loss
            if step % t.log_interval == 0 or skipped:
                log.write(record, step)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", skipped=nan_skips_total)
            if skipped:
                logger.info(f"step {step}: non-finite loss/gradient (loss {loss}, grad norm {grad_norm}); update "
                            f"skipped ({consecutive_skips} in a row, {nan_skips_total} in total)")
                if consecutive_skips >= t.max_consecutive_nan_skips:
                    raise NonFiniteLossError(
                        f"{consecutive_skips} consecutive steps had a non-finite loss or gradient (limit "
                        f"training.max_consecutive_nan_skips = {t.max_consecutive_nan_skips}); "
                        "lower training.optimizer.lr, "
                        "use bf16 instead of fp16, or resume from an earlier checkpoint")

            if valid_batches is not None and eval_iters and step % t.eval_interval == 0:
                heartbeat.beat(step, "eval")
                val = eval_loss(eng, valid_batches, eval_iters, t.global_batch)
                log.write({"step": step, "val_loss": val, "val_ppl": math.exp(min(val, 50.0))}, step)
                say(f"step {step}: validation loss {val:.4f}, perplexity {math.exp(min(val, 50.0)):.2f}")

            heartbeat.beat(step, "sync")
            stopping = stop.agreed(device)
            if saver:
                saver.poll()  # an async save from an earlier step: complete once every rank's files are durable
            periodic = recipe.checkpoint.save_interval and step % recipe.checkpoint.save_interval == 0
            evaluate = evaluation.due(step, total_steps) and not stopping  # evaluates the checkpoint saved now
            if ckpt_dir and (periodic or stopping or step == total_steps or evaluate):
                if stopping:
                    # no new evaluation on a stop: start() would wait without limit for the previous one
                    saver.finish()
                    eval_pending = None
                elif eval_pending is not None and saver.finish() == eval_pending:
                    # an async save still in flight for an evaluation: complete it (this save would anyway) and start
                    # its evaluation now, before this save replaces it as the pending one (or prunes it)
                    evaluation.start(eval_pending)
                    eval_pending = None
                save_now(capped=not (stopping or step == total_steps))  # uncapped when the run waits for it
                if stopping or step == total_steps:
                    saver.finish()  # a stop or the end waits for the disk: the run leaves a complete checkpoint
            if evaluate:
                eval_pending = step
            if eval_pending is not None and saver and saver.completed == eval_pending:
                evaluation.start(eval_pending)
                eval_pending = None
            if stopping:
                evaluation.cancel()
                logger.info(f"stopped by signal after step {step}; resume with the same command")
                break

        heartbeat.beat(step, "done")
        if progress is not None:
            progress.close()
        redirect.close()
        say(f"done: step {step}/{total_steps}, {consumed} samples, {nan_skips_total} skipped steps")
        log.close()
        if saver:
            saver.close()  # its writer process and shared-memory arena go now, not at interpreter exit
    finally:
        if saver:  # an error on the way: stop the writer now, no collective and no save completed (the ranks
            saver.abandon()  # may not all be here); a no-op after close()
    shutdown_distributed()
    evaluation.wait()  # rank 0: the last scores belong to the run (after the barrier: the other ranks need not wait)
    return 0


def _loss_scale(eng) -> float:
    opt = eng.engine.optimizer
    for name in ("cur_scale", "loss_scale"):
        v = getattr(opt, name, None)
        if isinstance(v, (int, float, torch.Tensor)):
            return float(v)
    return 1.0

"""What a run reports, written by global rank 0 only: one record per logged step into every sink (metrics.jsonl,
TensorBoard; W&B from recipes.train.tracking), progress lines on stdout, and the step progress: a tqdm bar on a
terminal, one line per training.log_interval in a batch job's log file (`progress`).

A sink is anything with `write(record, step)` and `close()`; `build_metrics_log` picks them from the recipe, and a
new one (another tracker) is one more class.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import resource
import sys
import time
from pathlib import Path
from typing import Protocol

import torch


class MetricsSink(Protocol):
    def write(self, record: dict, step: int) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """metrics.jsonl: one JSON object per line, appended (a resumed run's records follow the interrupted run's)."""

    def __init__(self, path: Path):
        self.file = open(path, "a")

    def write(self, record: dict, step: int) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    """Every number of a record as a scalar (but the step itself)."""

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(log_dir))

    def write(self, record: dict, step: int) -> None:
        for k, v in record.items():
            if k != "step" and isinstance(v, (int, float)):
                self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        self.tb.close()


class MetricsLog:
    """The run's records into every sink; `say` for progress lines on stdout (events such as resume, skips and stop
    go to the log, which --quiet does not hide). Disabled (no sinks, silent) on every rank but global rank 0."""

    def __init__(self, sinks: list[MetricsSink], quiet: bool, enabled: bool = True):
        self.sinks, self.quiet, self.enabled = sinks, quiet, enabled

    def add(self, sinks: list[MetricsSink]) -> None:
        """Sinks that need the resumed state (a tracker's run id: recipes.train.tracking)."""
        if self.enabled:
            self.sinks += sinks

    def write(self, record: dict, step: int) -> None:
        for sink in self.sinks:
            sink.write(record, step)

    def say(self, text: str) -> None:
        if self.enabled and not self.quiet:
            print(text, flush=True)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def build_metrics_log(recipe, log_dir: Path, enabled: bool, quiet: bool) -> MetricsLog:
    if not enabled:
        return MetricsLog([], quiet, enabled=False)
    log_dir.mkdir(parents=True, exist_ok=True)
    sinks: list[MetricsSink] = [JsonlSink(log_dir / "metrics.jsonl")]
    if recipe.logging.tensorboard:
        sinks.append(TensorBoardSink(log_dir / "tensorboard"))
    return MetricsLog(sinks, quiet)


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # peak RSS (KiB on Linux)


class ProgressBar:
    """tqdm on rank 0's stderr, for a terminal; log lines (saves, skips) go above the bar instead of being glued to
    its end."""

    def __init__(self, total: int, initial: int):
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self.redirect = contextlib.ExitStack()
        self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr)
        self.redirect.enter_context(logging_redirect_tqdm([logging.getLogger("recipes")]))

    def update(self, record: dict, interval: bool) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                             skipped=record["nan_skips_total"])

    def close(self) -> None:
        self.bar.close()
        self.redirect.close()


class IntervalLines:
    """For a batch job's log file (stdout not a terminal): no bar (its carriage returns garble a file), one line on
    stdout per training.log_interval, as Megatron-LM prints: the step, the wall time per step since the last line,
    lr, loss, grad norm, throughput, memory, and the time left at that pace."""

    def __init__(self, total: int, initial: int):
        self.total, self.last_step, self.last_time = total, initial, time.monotonic()

    def update(self, record: dict, interval: bool) -> None:
        if not interval:
            return
        now, step = time.monotonic(), record["step"]
        per_step = (now - self.last_time) / max(step - self.last_step, 1)
        self.last_step, self.last_time = step, now
        print(interval_line(record, self.total, per_step), flush=True)

    def close(self) -> None:
        pass


def interval_line(record: dict, total: int, per_step_s: float) -> str:
    r = record
    norm = f"{r['grad_norm']:.3f}" if r.get("grad_norm") is not None else "n/a"
    eta = datetime.timedelta(seconds=round(per_step_s * (total - r["step"])))
    return (f"iteration {r['step']:>8}/{total:>8} | consumed samples: {r['consumed_samples']:>10} | elapsed time per "
            f"iteration (ms): {per_step_s * 1000:.1f} | learning rate: {r['lr']:.6E} | lm loss: {r['loss']:.6E} | "
            f"grad norm: {norm} | tokens/s: {r['tokens_per_s']:,.0f} | TFLOP/s/GPU: {r['tflops_per_gpu']:.3g} | "
            f"MFU: {r['mfu']:.2%} | mem: {r['mem_gb']:.2f} GB | skipped: {r['nan_skips_total']} | ETA: {eta}")


class NoProgress:
    def update(self, record: dict, interval: bool) -> None:
        pass

    def close(self) -> None:
        pass


def progress(enabled: bool, total: int, initial: int, terminal: bool | None = None):
    """The step progress of rank 0 (none with --quiet or on other ranks): a bar on a terminal, one line per log
    interval otherwise. `terminal`: None = both stdout and stderr are terminals (the bar draws on stderr)."""
    if not enabled:
        return NoProgress()
    if terminal is None:
        terminal = sys.stdout.isatty() and sys.stderr.isatty()
    return ProgressBar(total, initial) if terminal else IntervalLines(total, initial)


class StepFigures:
    """A step's record: loss and optimizer figures, throughput (tokens/s, TFLOP/s per GPU, MFU from the model's FLOPs
    per step, recipes.model.shape), memory, progress counters."""

    def __init__(self, recipe, world: int, device: torch.device):
        from recipes.model.shape import model_flops_per_step

        t = recipe.training
        self.flops = model_flops_per_step(recipe.model, t.global_batch)
        self.tokens = t.global_batch * recipe.model.seq_length
        self.peak_tflops, self.world, self.device = recipe.cluster.peak_tflops, world, device

    def record(self, result, state, loss_scale: float) -> dict:
        """`result`: recipes.train.step.StepResult; `state`: recipes.train.resume.TrainState after the step."""
        tflops = self.flops / result.seconds / self.world / 1e12
        return {
            "step": result.step, "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
            "loss_scale": loss_scale, "tokens_per_s": self.tokens / result.seconds, "tflops_per_gpu": tflops,
            "mfu": tflops / self.peak_tflops, "mem_gb": memory_gb(self.device), "step_time_s": result.seconds,
            "consumed_samples": state.consumed_samples, "skipped": result.skipped,
            "nan_skips_total": state.nan_skips_total,
        }


def moe_routing(eng, recipe) -> dict:
    """Collective at the log interval (every rank, the same steps): the routing statistics of a mixture-of-experts
    model since the last call (tokens per expert, dropped tokens, load imbalance, aux and z losses; see
    recipes.model.moe.routing_stats), for the step's record; {} for a dense model (no collective)."""
    if recipe.model.moe is None:
        return {}
    from recipes.model.moe import routing_stats

    return routing_stats(eng.module, recipe.model, eng.layout.grad_accum_steps(recipe.training.global_batch),
                         eng.layout.dp, eng.device)


def mtp_figures(eng, recipe) -> dict:
    """Collective at the log interval: each model.mtp depth's mean loss (`mtp_loss`, recipes.model.mtp); {} without
    model.mtp (no collective)."""
    if recipe.model.mtp is None:
        return {}
    from recipes.model.mtp import mtp_losses

    return mtp_losses(eng.module, recipe.model, eng.device)


def pipeline_figures(eng, recipe) -> dict:
    """Collective at the log interval (every rank, the same steps): the last step's measured pipeline bubble beside
    the planner's, for the step's record; {} without a pipeline (no collective). Each rank's bubble is the time it
    waited on pipeline sends and receives over the rest of its schedule time (forward and backward); the record has
    their mean over ranks and the largest wait."""
    if eng.pipeline is None:
        return {}
    from recipes.parallel.layout import pipeline_bubble
    from recipes.train.collectives import all_gather_floats

    last, world = eng.pipeline.last, torch.distributed.get_world_size()
    compute = max(last.seconds - last.blocked, 1e-9)
    bubbles = all_gather_floats(last.blocked / compute, world, eng.device)
    blocked = all_gather_floats(last.blocked, world, eng.device)
    lay = eng.layout
    m = lay.grad_accum_steps(recipe.training.global_batch)
    return {"pp_bubble": sum(bubbles) / world, "pp_blocked_s": max(blocked),
            "pp_bubble_predicted": pipeline_bubble(lay.schedule, lay.pp, lay.vpp, m)}

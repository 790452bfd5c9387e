"""What a run reports, written by global rank 0 only: one record per logged step into every sink (metrics.jsonl,
TensorBoard, wandb when configured), progress lines on stdout, and the progress bar.

A sink is anything with `write(record, step)` and `close()`; `build_metrics_log` picks them from the recipe, and a
new one (another tracker, a log line per interval for batch jobs) is one more class here.
"""
from __future__ import annotations

import contextlib
import json
import logging
import resource
import sys
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


class WandbSink:
    def __init__(self, recipe, log_dir: Path):
        try:
            import wandb  # optional dependency: only imported when configured
        except ImportError:
            raise RuntimeError("logging.wandb_project is set but wandb is not installed: pip install wandb, "
                               "or remove logging.wandb_project (TensorBoard and metrics.jsonl need nothing)")
        self.run = wandb.init(project=recipe.logging.wandb_project, name=recipe.name, config=recipe.model_dump(),
                              dir=str(log_dir))

    def write(self, record: dict, step: int) -> None:
        self.run.log(record, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLog:
    """The run's records into every sink; `say` for progress lines on stdout (events such as resume, skips and stop
    go to the log, which --quiet does not hide). Disabled (no sinks, silent) on every rank but global rank 0."""

    def __init__(self, sinks: list[MetricsSink], quiet: bool, enabled: bool = True):
        self.sinks, self.quiet, self.enabled = sinks, quiet, enabled

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
    if recipe.logging.wandb_project:
        sinks.append(WandbSink(recipe, log_dir))
    return MetricsLog(sinks, quiet)


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # peak RSS (KiB on Linux)


class ProgressBar:
    """tqdm on rank 0's stderr (none with --quiet or on other ranks); log lines (saves, skips) go above the bar
    instead of being glued to its end."""

    def __init__(self, enabled: bool, total: int, initial: int):
        self.bar = None
        self.redirect = contextlib.ExitStack()
        if not enabled:
            return
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr)
        self.redirect.enter_context(logging_redirect_tqdm([logging.getLogger("recipes")]))

    def update(self, loss: float, lr: float, skipped: int) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", skipped=skipped)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.redirect.close()


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

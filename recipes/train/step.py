"""One optimizer step: forward/backward over this rank's micro-batches (the pipeline engine's schedule, or the plain
engine's loop), what the optimizer did with it (grad norm, skipped on a non-finite loss or gradient), and the NaN
policy (how many skipped steps in a row end the run)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    pass


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


@dataclass
class StepResult:
    step: int  # the step just trained (1-based)
    loss: float
    lr: float
    seconds: float  # wall time of the step on this rank (data + forward/backward + optimizer)
    grad_norm: float | None = None  # None where DeepSpeed keeps no norm (ZeRO-0 without fp16)
    skipped: bool = False  # non-finite loss or gradient: the update was skipped


def outcome(eng, result: StepResult) -> StepResult:
    """Fill in what the optimizer did: the global grad norm and whether the update was skipped."""
    norm = eng.engine.get_global_grad_norm()
    result.grad_norm = float(norm) if norm is not None else None
    bad_norm = result.grad_norm is not None and not math.isfinite(result.grad_norm)
    result.skipped = (not math.isfinite(result.loss)) or eng.optimizer.last_skipped or bad_norm
    return result


def loss_scale(eng) -> float:
    opt = eng.engine.optimizer
    for name in ("cur_scale", "loss_scale"):
        v = getattr(opt, name, None)
        if isinstance(v, (int, float, torch.Tensor)):
            return float(v)
    return 1.0


class NanPolicy:
    """Skipped steps are counted (in total: kept in the checkpoint; in a row: this run); too many in a row stop the
    run with what to do about it."""

    def __init__(self, max_consecutive: int, skipped_total: int = 0):
        self.max_consecutive, self.total, self.in_a_row = max_consecutive, skipped_total, 0

    def observe(self, result: StepResult) -> None:
        if not result.skipped:
            self.in_a_row = 0
            return
        self.total += 1
        self.in_a_row += 1

    def check(self, result: StepResult) -> None:
        """After the step's record is written: log a skip; raise at the limit."""
        if not result.skipped:
            return
        logger.info(f"step {result.step}: non-finite loss/gradient (loss {result.loss}, grad norm {result.grad_norm});"
                    f" update skipped ({self.in_a_row} in a row, {self.total} in total)")
        if self.in_a_row >= self.max_consecutive:
            raise NonFiniteLossError(
                f"{self.in_a_row} consecutive steps had a non-finite loss or gradient (limit "
                f"training.max_consecutive_nan_skips = {self.max_consecutive}); lower training.optimizer.lr, "
                "use bf16 instead of fp16, or resume from an earlier checkpoint")

"""One optimizer step: forward/backward over this rank's micro-batches (the pipeline schedule, or the plain engine's
loop), what the optimizer did with it (grad norm, skipped on a non-finite loss or gradient), and the NaN
policy (how many skipped steps in a row end the run)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from recipes.checkpoint.format import deepspeed_private

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    pass


def train_step(eng, micro_batches) -> float:
    """One optimizer step over this rank's micro-batches; returns the mean loss over the global batch."""
    from megatron.core import parallel_state

    if eng.pipeline is not None:
        return _mean_over_dp(pipeline_step(eng, micro_batches), eng.device)

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


def pipeline_step(eng, micro_batches) -> float:
    """PP > 1: the schedule runs every micro-batch's forward and backward with DeepSpeed's gradient reduction held
    back (`no_sync`), the tied embedding's two copies get the sum of their gradients, then ZeRO reduces over DP once
    and steps: what DeepSpeed's own pipeline engine did after its 1F1B schedule. Returns the pipeline's mean loss."""
    ds = eng.engine
    ds.set_gradient_accumulation_boundary(False)
    with ds.no_sync():
        loss = eng.pipeline.train(micro_batches, scale=loss_scale(eng) if eng.ds_config.get("fp16") else 1.0)
    sum_tied_embedding_grads(eng.module)
    ds.set_gradient_accumulation_boundary(True)
    deepspeed_private.reduce_pipeline_gradients(ds)
    ds.step()
    return loss


def sum_tied_embedding_grads(stack) -> None:
    """A tied word embedding lives on the first pipeline rank (the input) and the last (the head, `TiedHeadCopy`;
    model.mtp's depths embed tokens there too): each copy's gradient becomes their sum (megatron-core's embedding
    group: those two ranks of each pipeline), so both take the same update and stay equal."""
    from megatron.core import parallel_state as ps

    in_group = ps.is_rank_in_embedding_group(ignore_virtual=True)
    if not in_group or not hasattr(stack, "0") or not stack.shares_embedding:
        return
    weight = getattr(stack, "0").word_embeddings.weight
    if weight.grad is not None:
        torch.distributed.all_reduce(weight.grad, group=ps.get_embedding_group())


def _mean_over_dp(loss: float, device) -> float:
    from megatron.core import parallel_state

    total = torch.tensor(loss, device=device, dtype=torch.float32)
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

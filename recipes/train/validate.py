"""Validation loss during training: every `training.eval_interval` steps, the mean loss over `training.eval_iters`
global batches from the start of the validation split (the same batches each time, so the curve compares)."""
from __future__ import annotations

import math

import torch

from recipes.train.data import MicroBatches


@torch.no_grad()
def eval_loss(eng, batches: MicroBatches, iters: int, global_batch: int) -> float:
    """Mean validation loss over `iters` global batches from the start of the validation split."""
    from megatron.core import parallel_state

    losses = []
    for i in range(iters):
        mbs = batches.step(i * global_batch)
        if eng.pipeline is not None:
            eng.module.eval()  # the chunks run this rank's layers: eval mode (no MoE statistics, no aux loss)
            try:
                total = torch.tensor(eng.pipeline.evaluate(mbs), device=eng.device)
            finally:
                eng.module.train()
            torch.distributed.all_reduce(total, group=parallel_state.get_data_parallel_group())
            losses.append(float(total) / parallel_state.get_data_parallel_world_size())
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


class Validator:
    def __init__(self, eng, batches: MicroBatches | None, iters: int, interval: int, global_batch: int):
        self.eng, self.batches, self.iters = eng, batches, iters
        self.interval, self.global_batch = interval, global_batch

    def due(self, step: int) -> bool:
        """Every rank answers alike (validation is collective)."""
        return self.batches is not None and bool(self.iters) and step % self.interval == 0

    def run(self, step: int) -> dict:
        """Collective: the validation record of `step`."""
        val = eval_loss(self.eng, self.batches, self.iters, self.global_batch)
        return {"step": step, "val_loss": val, "val_ppl": math.exp(min(val, 50.0))}

"""Pipeline parallelism on torch.distributed.pipelining: the rank's chunks of the model, and one optimizer step's
forward and backward on the recipe's schedule.

- The model: pipeline rank r holds the layers of its virtual stages r, r + pp, ... (recipes.parallel.partition) in one
  `DecoderStack`, the module DeepSpeed wraps (ZeRO-1 shards its optimizer state over DP); each virtual stage is a
  `StageChunk` over those layers, run by a `PipelineStage`.
- The schedules (`parallel.pipeline_schedule`): `1f1b` (torch's Schedule1F1B, one chunk per rank: bubble (p-1)/m),
  `interleaved_1f1b` (ScheduleInterleaved1F1B, v chunks per rank: (p-1)/(v m)), `zero_bubble`
  (ScheduleInterleavedZeroBubble: each backward split into its input half, on the critical path, and its weight half,
  deferred into the bubble). These are the schedules torchtitan runs; megatron-core's own hard-code CUDA.
- Gradients: the loss of each micro-batch is divided by m before backward (DeepSpeed's own convention, so MoE's
  auxiliary loss and fp16 loss scaling keep their meaning), the schedule accumulates them on the parameters, then a
  tied embedding's two copies (first and last rank) are summed over megatron-core's embedding group, and ZeRO reduces
  over DP and steps (recipes.train.step).
- The bubble is measured: the time each rank waits on pipeline sends and receives (recipes.parallel.torch_private).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from recipes.parallel.partition import chunk_layers, virtual_stages

SCHEDULES = {"1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
             "zero_bubble": "ScheduleInterleavedZeroBubble"}


@dataclass
class PipelineModel:
    stack: torch.nn.Module  # this rank's layers (recipes.model.layers.DecoderStack): what DeepSpeed wraps
    chunks: list  # StageChunk per virtual stage this rank holds, in the order it runs them
    stages: list[int]  # their virtual stage indices
    num_stages: int  # pp x vpp


def build_pipeline_model(recipe, layout, pp_rank: int) -> PipelineModel:
    from recipes.model.layers import DecoderStack, StageChunk

    m = recipe.model
    chunks = chunk_layers(m, layout.tp, layout.pp, layout.vpp, recipe.parallel.pipeline_partition, layout.ep)
    mine = virtual_stages(pp_rank, layout.pp, layout.vpp)
    held = sorted(i for v in mine for i in chunks[v])
    tied_copy = (m.tied_embeddings or m.mtp is not None) and len(chunks) - 1 in mine  # the last chunk embeds too
    stack = DecoderStack(recipe, layout, held, tied_copy=tied_copy)
    return PipelineModel(stack=stack, chunks=[StageChunk(stack, chunks[v]) for v in mine], stages=mine,
                         num_stages=len(chunks))


@dataclass
class StepFigures:
    seconds: float = 0.0  # wall time of the schedule (forward and backward of every micro-batch)
    blocked: float = 0.0  # of which waiting on pipeline sends and receives
    extra: dict = field(default_factory=dict)


class PipelineRunner:
    """Runs one step's micro-batches through this rank's stages on the recipe's schedule."""

    def __init__(self, model: PipelineModel, recipe, layout, device: torch.device, micro_batches: int, loss_fn):
        from megatron.core import parallel_state as ps
        from torch.distributed import pipelining

        from recipes.parallel.torch_private import P2P_WAIT_CLOCK

        self.model, self.m, self.loss_fn = model, micro_batches, loss_fn
        self.mtp = recipe.model.mtp is not None  # the labels go to every stage: the last one's depths embed them
        self.clock = P2P_WAIT_CLOCK.install()
        self.group = ps.get_pipeline_model_parallel_group()
        shapes = StageShapes(recipe, layout, _dtype_of(model.stack))
        # Static shapes: torch's dynamic inference would send the stages' metadata as pickled objects
        # (send_object_list) and run an extra forward of the first micro-batch (counted in MoE routing statistics).
        self.stages = [pipelining.PipelineStage(chunk, v, model.num_stages, device, group=self.group,
                                                input_args=shapes.input(v), output_args=shapes.output(v, model))
                       for chunk, v in zip(model.chunks, model.stages)]
        self.has_first = 0 in model.stages
        self.has_last = model.num_stages - 1 in model.stages
        cls = getattr(pipelining, SCHEDULES[layout.schedule])
        target = self.stages[0] if layout.schedule == "1f1b" else self.stages
        # scale_grads=False: the loss is divided by m here, as DeepSpeed's engine does (see the module docstring)
        self.schedule = cls(target, n_microbatches=micro_batches, loss_fn=self._loss, scale_grads=False)
        self.losses: list[torch.Tensor] = []  # this step's micro-batch losses (last rank), unscaled
        self.scale = 1.0  # fp16: the loss scale of this step
        self.last = StepFigures()

    def _loss(self, logits, target):
        loss = self.loss_fn(logits, (target[:, 0], target[:, 1].float()))
        self.losses.append(loss.detach().float())
        return loss * (self.scale / self.m)

    def train(self, micro_batches, scale: float = 1.0) -> float:
        """Forward and backward of every micro-batch (gradients accumulated on this rank's parameters). Returns the
        mean loss over the micro-batches, on every rank of the pipeline."""
        self.scale = scale
        return self._run(micro_batches, self.schedule.step)

    def evaluate(self, micro_batches) -> float:
        """Forward only: the mean loss of this rank's micro-batches, on every rank of the pipeline."""
        return self._run(micro_batches, self.schedule.eval)

    def _run(self, micro_batches, call) -> float:
        tokens, target, kwargs = pack(list(micro_batches), self.mtp)
        self.losses = []
        self.clock.start()
        t0 = time.perf_counter()
        try:
            call(tokens, target=target, **kwargs)
        finally:
            self.last = StepFigures(seconds=time.perf_counter() - t0, blocked=self.clock.stop())
        return self._mean_loss(tokens.device)

    def _mean_loss(self, device) -> float:
        """The last rank's mean over the micro-batches, handed to every rank of the pipeline (a sum over the PP group
        of that mean and zeros: a fixed-shape tensor, nothing pickled)."""
        total = torch.zeros((), device=device)
        if self.has_last and self.losses:
            # the last m: a schedule's first step (and each switch between training and evaluation) also runs the
            # loss once while it infers the shapes its stages exchange
            total += torch.stack(self.losses[-self.m:]).mean()
        torch.distributed.all_reduce(total, group=self.group)
        return float(total)


class StageShapes:
    """What each virtual stage receives and sends, for one micro-batch (meta tensors: shapes and dtypes only). A
    stage boundary carries the hidden state [s, b, h] with s the tokens this rank holds: the sequence over CP, and
    over TP under sequence parallelism; the first stage takes the token ids [b, S], the last one's output is the
    vocab-parallel logits [S / cp, b, V / tp]."""

    def __init__(self, recipe, layout, dtype: torch.dtype):
        m = recipe.model
        self.b, self.seq, self.dtype = layout.micro_batch, m.seq_length, dtype
        local = m.seq_length // layout.cp
        self.hidden = (local // layout.tp if layout.sequence_parallel and layout.tp > 1 else local, self.b,
                       m.hidden_size)
        # model.mtp: each prediction depth's logits follow the main ones along the sequence (recipes.model.mtp)
        self.logits = ((1 + m.mtp_depths) * local, self.b, m.padded_vocab_size(layout.tp) // layout.tp)

    def input(self, stage: int) -> torch.Tensor:
        if stage == 0:
            return torch.empty((self.b, self.seq), dtype=torch.long, device="meta")
        return self._activation(self.hidden)  # its gradient goes back to the previous stage

    def output(self, stage: int, model: PipelineModel) -> torch.Tensor:
        return self._activation(self.logits if stage == model.num_stages - 1 else self.hidden)

    def _activation(self, shape) -> torch.Tensor:
        return torch.empty(shape, dtype=self.dtype, device="meta", requires_grad=True)


def _dtype_of(stack) -> torch.dtype:
    """The dtype the stages exchange: the model's (DeepSpeed casts it to bf16 / fp16 when the recipe trains in them)."""
    return next(p.dtype for p in stack.parameters() if p.is_floating_point())


def pack(micro_batches: list, mtp: bool = False):
    """The step's micro-batches as whole-batch tensors, which the schedule cuts back into the same micro-batches
    (torch.tensor_split along the batch dimension): tokens [m b, s], target [m b, 2, s] (labels and loss mask), and
    the position ids as a keyword (document masking: every stage needs them); with `mtp` the labels as one too
    (model.mtp's depths embed them on the last stage)."""
    inputs = [mb[0] for mb in micro_batches]
    kwargs = {}
    if isinstance(inputs[0], tuple):
        kwargs["position_ids"] = torch.cat([i[1] for i in inputs])
        inputs = [i[0] for i in inputs]
    labels = torch.cat([mb[1][0] for mb in micro_batches])
    mask = torch.cat([mb[1][1] for mb in micro_batches])
    target = torch.stack([labels, mask.to(labels.dtype)], dim=1)
    if mtp:
        kwargs["mtp_labels"] = labels
    return torch.cat(inputs), target, kwargs

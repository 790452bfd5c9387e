"""Pipeline schedules in the cost model: the bubble, the activations in flight and the stage-to-stage sends of plain
1F1B, interleaved 1F1B (`parallel.vpp` model chunks per pipeline rank) and zero-bubble, as torch.distributed.pipelining
runs them (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble).

Bubble per step, with p stages, m micro-batches a step, v chunks per rank and t the time of one micro-batch on the
slowest stage (forward F + input-gradient backward B + weight-gradient backward W):
- 1F1B (Narayanan et al. 2021): (p-1) t, a fraction (p-1)/m of the compute.
- interleaved 1F1B (ibid.): each rank idles (p-1) slots of one chunk, t / v: (p-1) t / v, a fraction (p-1)/(v m).
- zero-bubble: torch's ScheduleInterleavedZeroBubble is the ZB-H1 schedule of Qi et al. 2024 ("Zero Bubble Pipeline
  Parallelism", ICLR 2024; its docstring: "implementing the ZB1P schedule in the paper"), generalised to v chunks:
  the weight-gradient passes W, which nothing downstream waits for, are deferred into the bubble, which shrinks from
  (p-1)(F+B+W) to (p-1)(F+B-W); per chunk that is (p-1)(t - 2W)/v. A GEMM's W is a third of its time (forward,
  input gradient and weight gradient are GEMMs of one size); attention has no weights, so W < t/3 and the bubble is
  more than a third of 1F1B's.

Activations in flight on the first stage, in micro-batches of the stage's layers (Korthikanti et al. 2022, Sec. 4.2):
1F1B min(p, m); interleaved 1F1B x (1 + (p-1)/(p v)) (its warm-up runs 2(p-1) + (v-1)p chunk forwards before the
first backward, torch's `_get_warmup_ops` with multiply_factor 2); zero-bubble as 1F1B (torch warms up (v-1)p + (p-1)
chunk forwards, multiply_factor 1: p micro-batches of the stage's layers; ZB-H1's peak memory is 1F1B's, Qi et al.).

Sends: each micro-batch crosses every stage boundary forward (activations) and backward (gradients); with v chunks
per rank it crosses v times as many boundaries, so interleaving multiplies the messages by v.
"""
from __future__ import annotations

from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.compute import MicroBatchTimes
from recipes.planner.links import group_bus_gbps

SCHEDULES = ("1f1b", "interleaved_1f1b", "zero_bubble")  # in order of simplicity (recommend the simplest that ties)


def bubble_seconds(layout: Layout, t: MicroBatchTimes, slot: float) -> float:
    """Idle seconds per step of the slowest stage: `slot` is one micro-batch's time on it (compute, recompute and the
    collectives inside it), `t` its compute parts (the weight-gradient share for zero-bubble)."""
    p, v = layout.pp, layout.vpp
    if p <= 1:
        return 0.0
    if layout.schedule == "zero_bubble":
        slot = max(0.0, slot - 2 * t.weight_grad)
    return (p - 1) / v * slot


def in_flight(layout: Layout, m: int) -> float:
    """Micro-batches of the first stage's layers whose activations are held at the peak (see the module docstring)."""
    p, v = layout.pp, layout.vpp
    held = min(p, m)
    if layout.schedule == "interleaved_1f1b" and v > 1 and m >= p:
        return held * (1 + (p - 1) / (p * v))
    return held


def messages(layout: Layout, m: int) -> int:
    """Point-to-point messages on the critical path of one step: activations forward and gradients backward, per
    micro-batch and chunk boundary (v m + p - 2 of each)."""
    if layout.pp <= 1:
        return 0
    return 2 * (layout.vpp * m + layout.pp - 2)


def pp_seconds(model_cfg, cluster, layout: Layout, m: int, act_bytes: int, assume: Assumptions,
               compute_s: float = 0.0) -> float:
    """Pipeline p2p per step: `messages` of one micro-batch's s / cp tokens (/ t under SP) each, not overlapped; for a
    stack with asynchronous sends (`pp_comm_overlap`), what `overlap_efficiency` of the step's compute (`compute_s`)
    does not hide."""
    p, t = layout.pp, layout.tp
    if p <= 1:
        return 0.0
    spans = t * layout.cp * layout.dp >= cluster.gpus_per_node  # neighbouring stages sit t*cp*dp ranks apart
    # Across nodes every GPU sends its own p2p at the same time: each gets its share of the node's NICs.
    bw = group_bus_gbps(cluster, assume, 1, spans)
    msg = model_cfg.seq_length // layout.cp * layout.micro_batch * model_cfg.hidden_size * act_bytes / (
        t if layout.sequence_parallel else 1)
    lat = assume.latency_inter_s if spans else assume.latency_intra_s
    total = messages(layout, m) * (msg / (bw * 1e9) + lat)
    if assume.pp_comm_overlap:
        return max(0.0, total - assume.overlap_efficiency * compute_s)
    return total


def schedule_options(model_cfg, pp: int) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs the search prices at PP = pp: plain 1F1B; interleaved 1F1B and zero-bubble at 2 chunks
    per rank and at one layer per chunk (the most interleaving, the smallest bubble, the most sends); zero-bubble
    also at one chunk. Each chunk needs a decoder layer (recipes.parallel.layout)."""
    if pp <= 1:
        return [("1f1b", 1)]
    most = model_cfg.num_layers // pp
    chunks = sorted({v for v in (2, most) if 2 <= v <= most})
    return ([("1f1b", 1), ("zero_bubble", 1)] + [("interleaved_1f1b", v) for v in chunks]
            + [("zero_bubble", v) for v in chunks])


def schedule_words(layout: Layout, m: int, bubble_fraction: float) -> str:
    """'interleaved 1F1B, 8 chunks per rank: (p-1)/(v m) = 15/(8 x 32) = 5.9%': the schedule and its bubble as a
    share of the pipelined work, by the schedule's own formula (see the module docstring)."""
    p, v = layout.pp, layout.vpp
    if layout.schedule == "interleaved_1f1b":
        return f"interleaved 1F1B, {v} chunks per rank: (p-1)/(v m) = {p - 1}/({v} x {m}) = {bubble_fraction:.1%}"
    if layout.schedule == "zero_bubble":
        chunks = f", {v} chunks per rank" if v > 1 else ""
        return (f"zero-bubble{chunks}: (p-1)(F+B-W)/(v m (F+B+W)) = {bubble_fraction:.1%}, the weight gradients W "
                "filling the rest")
    return f"1F1B: (p-1)/m = {p - 1}/{m} = {bubble_fraction:.1%}"

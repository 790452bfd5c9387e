"""Tensor- and data-parallel communication per step: what each layout's collectives cost on the critical path, as
megatron-core's layers and DeepSpeed's ZeRO optimizers issue them (pipeline sends: recipes.planner.pipeline; CP:
recipes.planner.context; MoE all-to-alls: recipes.planner.experts; ZeRO-3's per-module gathers: recipes.planner.zero3)."""
from __future__ import annotations

import math

from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.compute import column_dgrad_seconds, stage_layer_count
from recipes.planner.experts import stage_parameters
from recipes.planner.links import Link, dp_link, strided_link, tp_link
from recipes.planner.memory import params_per_gpu
from recipes.planner.zero3 import zero3_exposed_seconds


def tp_seconds(model_cfg, cluster, layout: Layout, priced: Layout, act_bytes: int, assume: Assumptions,
               eff: float, gemm_s: float) -> float:
    """Tensor-parallel collectives of one micro-batch on the slowest stage, as megatron-core runs them. Without SP:
    two all-reduces per layer forward (row-parallel outputs) and two backward (column-parallel input gradients),
    two more under full recompute (its forward runs again). With SP each all-reduce is an all-gather + a
    reduce-scatter of the same volume (the ring all-reduce is exactly those two); the backward also all-gathers the
    column-parallel inputs again for their weight gradients (SP saves only the rank's slice), overlapped with the
    input-gradient GEMM: its part that GEMM does not hide counts. Priced on the critical path otherwise (megatron-core
    issues the backward input-gradient reductions async beside the weight-gradient GEMM: a conservative price), or,
    for a stack with TP overlap (`tp_comm_overlap`), what `overlap_efficiency` of the GEMMs (`gemm_s`) does not hide."""
    t = layout.tp
    if t <= 1:
        return 0.0
    link = tp_link(cluster, layout, assume)
    full = model_cfg.seq_length // layout.cp * layout.micro_batch * model_cfg.hidden_size * act_bytes
    passes = 3 if priced.recompute == "full" else 2  # forward, backward (+ the recompute forward)
    n_l = stage_layer_count(model_cfg.num_layers, layout.pp, model_cfg.mtp_depths)
    if not layout.sequence_parallel:
        total = n_l * passes * 2 * link.seconds(full, "all_reduce")
    else:
        pairs = passes * 2 * (link.seconds(full, "all_gather") + link.seconds(full, "reduce_scatter"))
        gather = link.seconds(full, "all_gather")
        regather = sum(max(0.0, gather - assume.overlap_efficiency * dgrad)
                       for dgrad in column_dgrad_seconds(model_cfg, layout, eff, cluster.peak_tflops))
        total = n_l * (pairs + regather)
    if assume.tp_comm_overlap:
        return max(0.0, total - assume.overlap_efficiency * gemm_s)
    return total


def dp_exposed_seconds(model_cfg, cluster, layout: Layout, m: int, t_model_mb: float, t_recompute_mb: float,
                       act_bytes: int, assume: Assumptions) -> float:
    """Data-parallel traffic per step that the compute does not hide, by ZeRO stage, over the data axis DP x CP; a MoE
    model's routed experts over their expert-data-parallel group (DP x CP / EP ranks, TP x EP apart) after the rest
    (DeepSpeed reduces the two param groups one after the other)."""
    if layout.data_axis <= 1:
        return 0.0
    link = dp_link(cluster, layout, assume)
    if layout.zero_stage == 3:
        return m * zero3_exposed_seconds(model_cfg, layout, link, t_model_mb, t_recompute_mb, act_bytes, assume)
    psi = params_per_gpu(model_cfg, layout.tp, layout.pp, layout.ep)
    experts = stage_parameters(model_cfg, layout.tp, layout.pp, layout.ep)[1]
    backward = t_model_mb * 2 / 3 + t_recompute_mb
    edp = strided_link(cluster, layout.data_axis // layout.ep, layout.tp * layout.ep, assume)
    z = layout.zero_stage
    return (zero_traffic_seconds(link, psi - experts, act_bytes, m, backward, z, assume)
            + zero_traffic_seconds(edp, experts, act_bytes, m, backward, z, assume))


def zero_traffic_seconds(link: Link, params: float, act_bytes: int, m: int, backward_s: float, z: int,
                         assume: Assumptions) -> float:
    """ZeRO-0/1/2 traffic of `params` gradients per rank over `link` that the compute (`backward_s` a micro-batch)
    does not hide."""
    if link.n <= 1 or params <= 0:
        return 0.0
    grad_bytes = params * act_bytes
    chunk = assume.bucket_elements * act_bytes
    calls = math.ceil(grad_bytes / chunk)
    if z in (0, 1):  # one all-reduce (ZeRO-1: reduce-scatter + all-gather, the same volume) after the last backward
        reduce = link.seconds(grad_bytes, "all_reduce", calls)
        if assume.dp_comm_overlap:  # a stack that reduces buckets while the last backward runs
            return max(0.0, reduce - assume.overlap_efficiency * backward_s)
        return reduce
    # ZeRO-2: a reduce-scatter every micro-batch (hidden by its backward with overlap_comm) + one all-gather
    rs = link.seconds(grad_bytes, "reduce_scatter", calls)
    window = min(rs, backward_s * assume.overlap_efficiency) if assume.overlap_comm else 0.0
    return m * (rs - window) + link.seconds(grad_bytes, "all_gather", calls)

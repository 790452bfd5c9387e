"""Cost model of a training layout: memory per GPU, step time by priced cause, throughput, MFU, days.

Everything here is arithmetic on the recipe's model shape, a cluster description and a `Layout`; nothing touches a GPU.
`estimate` prices one layout from the parts, one module per concern: compute (`compute`), memory (`memory`), tensor-
and data-parallel traffic (`comm`, `zero3`), context parallelism (`context`), experts (`experts`), pipeline schedules
(`pipeline`), collectives (`links`); the search over layouts is `search`, the modelling choices `assumptions`.

Sources (docs/planner.md shows the checks against their published numbers): parameter and FLOP counts from Narayanan
et al. 2021 (Megatron-LM, Eq. 2 and Eq. 3) and Korthikanti et al. 2022 (model FLOPs, activation memory Table 2);
model-state memory from Rajbhandari et al. 2019 (ZeRO); ring collective costs from nccl-tests PERFORMANCE.md;
pipeline schedules from Narayanan et al. 2021 and Qi et al. 2024 (zero bubble). The efficiency terms are fitted to
published runs (recipes.planner.calibration) and can be fitted to a cluster's own (`plan --calibrate`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from recipes.model.shape import hardware_flops_per_step, model_flops_per_step
from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.comm import dp_exposed_seconds, tp_seconds
from recipes.planner.compute import compute_efficiency, micro_batch_seconds
from recipes.planner.context import cp_seconds
from recipes.planner.experts import ep_seconds, imbalance_seconds
from recipes.planner.links import tp_link
from recipes.planner.memory import (  # re-exported: recipes.tools and recipes.train read them from here
    GB, GiB, communicators, deepspeed_bucket_bytes, device_gib, device_memory, format_memory, memory_per_gpu,
    params_per_gpu, zero_model_state_bytes,
)
from recipes.planner.pipeline import bubble_seconds, pp_seconds

__all__ = ["Assumptions", "Estimate", "StepTerms", "estimate", "effective_layout", "model_flops_per_step", "GB", "GiB",
           "communicators", "deepspeed_bucket_bytes", "device_gib", "device_memory", "format_memory",
           "params_per_gpu", "zero_model_state_bytes", "layout_problems", "MEMORY_VERDICTS"]

# How a layout's memory compares with the device, best first (see `memory_verdict`).
MEMORY_VERDICTS = ("fits", "tight", "maybe", "over")
NEAR = 0.05  # a total within 5% of the line it is judged against is "near the boundary"


@dataclass(frozen=True)
class StepTerms:
    """Seconds of one optimizer step, by priced cause; they add up to `step`. A new kind of parallelism adds its term
    here (a field), its price in `estimate` and its words in `recipes.planner.explain.term_words`."""
    compute: float = 0.0  # the model's FLOPs on the slowest pipeline stage, all micro-batches
    recompute: float = 0.0  # the forward again under recompute=full (selective: the attention scores)
    tp_comm: float = 0.0  # tensor-parallel all-reduces, or SP's all-gathers and reduce-scatters (not overlapped)
    cp_comm: float = 0.0  # context-parallel K/V all-gathers and their gradients' reduce-scatters (not overlapped)
    ep_comm: float = 0.0  # MoE dispatch / combine all-to-alls over EP (+ the routed tokens' extra TP traffic)
    imbalance: float = 0.0  # waiting for the busiest EP rank's extra routed tokens (Assumptions.moe_load_imbalance)
    bubble: float = 0.0  # pipeline fill and drain, by schedule (recipes.planner.pipeline)
    pp_comm: float = 0.0  # stage-to-stage sends
    dp_comm: float = 0.0  # data-parallel traffic the compute does not hide
    overhead: float = 0.0  # fixed per step outside the model (optimizer, data, logging): Assumptions.step_overhead_s

    @property
    def step(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, float]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["step"] = sum(d.values())
        return d

    def minus(self, other: "StepTerms") -> dict[str, float]:
        """Per term, how many more seconds this step spends than `other`'s."""
        return {f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}


@dataclass
class Estimate:
    layout: Layout
    fits: bool  # some stack can hold it: the lean activation count is within the device (memory_verdict != "over")
    tight: bool  # it fits, but not with the headroom: inside the margin, or only under the lean count
    memory_gib: dict[str, float]  # params, grads, optimizer, activations, buffers, fragmentation, total, total_lean
    buffers_gib: dict[str, float]  # what "buffers" holds: cuda_context, communicators, deepspeed_buckets, zero3_gathered
    communicators: int  # NCCL communicators a rank uses (each holds its own buffers)
    gpu_memory_gib: float  # the device's memory: cluster.gpu_memory_gb (decimal GB) in GiB
    memory_budget_gib: float  # gpu_memory_gib less the headroom
    params_per_gpu: float
    micro_batches: int
    terms: StepTerms
    compute_efficiency: float  # achieved / peak FLOP/s of the GEMMs at this micro-batch and TP slice
    bubble_fraction: float  # the bubble as a share of the step's pipelined work (the schedule's formula)
    tokens_per_s: float
    tflops_per_gpu: float  # model TFLOP/s per GPU (no recompute counted)
    hardware_tflops_per_gpu: float
    mfu: float
    days: float | None
    gpu_hours: float | None
    memory_verdict: str = "fits"  # one of MEMORY_VERDICTS
    near_boundary: bool = False  # the total is within NEAR of the line its verdict was drawn at
    notes: list[str] = field(default_factory=list)

    @property
    def time_s(self) -> dict[str, float]:
        """The step's terms and their sum, in seconds (compute, recompute, tp_comm, cp_comm, ep_comm, imbalance, bubble,
        pp_comm, dp_comm, overhead, step)."""
        return self.terms.as_dict()

    @property
    def fits_with_headroom(self) -> bool:
        return self.memory_verdict == "fits"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = asdict(self.layout)
        d["layout"]["describe"] = self.layout.describe()
        d["time_s"] = self.time_s
        return d


def memory_verdict(mem: dict[str, float], capacity: float, budget: float) -> tuple[str, bool]:
    """'fits' (Korthikanti's count within the budget), 'tight' (within the device, not the budget), 'maybe' (over the
    device under Korthikanti's count, an upper bound, but within it under the lean count), 'over' (even the lean count
    is over the device); and whether the total is within NEAR of the line it was judged at."""
    upper, lean = mem["total"], mem["total_lean"]
    if upper <= budget:
        return "fits", upper > budget * (1 - NEAR)
    if upper <= capacity:
        return "tight", upper > capacity * (1 - NEAR) or upper < budget * (1 + NEAR)
    if lean <= capacity:
        return "maybe", True
    return "over", lean < capacity * (1 + NEAR)


def step_terms(model_cfg, cluster, layout: Layout, priced: Layout, m: int, act_bytes: int,
               assume: Assumptions) -> tuple[StepTerms, float]:
    """The step's priced terms and the GEMM efficiency they were priced at."""
    eff = compute_efficiency(model_cfg, layout, assume)
    t = micro_batch_seconds(model_cfg, cluster, layout, priced, eff, assume)
    gemm = t.model + t.recompute  # what TP overlap may hide behind (attention included: a conservative window)
    t_tp = tp_seconds(model_cfg, cluster, layout, priced, act_bytes, assume, eff, gemm)
    t_cp = cp_seconds(model_cfg, cluster, layout, priced, act_bytes, assume)
    t_ep = ep_seconds(model_cfg, cluster, layout, priced, act_bytes, assume, tp_link(cluster, layout, assume))
    t_wait = imbalance_seconds(model_cfg, cluster, layout, priced, assume)
    slot = t.model + t.recompute + t_tp + t_cp + t_ep + t_wait
    terms = StepTerms(
        compute=m * t.model, recompute=m * t.recompute, tp_comm=m * t_tp, cp_comm=m * t_cp, ep_comm=m * t_ep,
        imbalance=m * t_wait, bubble=bubble_seconds(layout, t, slot),
        pp_comm=pp_seconds(model_cfg, cluster, layout, m, act_bytes, assume, m * t.model),
        dp_comm=dp_exposed_seconds(model_cfg, cluster, layout, m, t.model, t.recompute, act_bytes, assume),
        overhead=assume.step_overhead_s)
    return terms, eff


def estimate(model_cfg, cluster, layout: Layout, global_batch: int, *, precision: str = "bf16",
             train_tokens: float | None = None, assume: Assumptions = Assumptions()) -> Estimate:
    """Memory, time and throughput of one layout. Pure arithmetic; valid only for layouts `layout_problems` accepts."""
    priced = effective_layout(layout, assume)  # the layout's own settings are reported; costs are of what runs
    m = global_batch // (layout.micro_batch * layout.dp)
    act_bytes = 2 if precision != "fp32" else 4
    mem, buffers = memory_per_gpu(model_cfg, layout, priced, m, precision, assume)
    capacity = device_gib(cluster)
    budget = capacity * (1 - assume.memory_headroom)
    verdict, near = memory_verdict(mem, capacity, budget)
    terms, eff = step_terms(model_cfg, cluster, layout, priced, m, act_bytes, assume)
    notes = ["TP crosses nodes: its collectives run over InfiniBand"] if layout.tp > cluster.gpus_per_node else []

    step, world = terms.step, layout.world_size
    tokens_per_s = global_batch * model_cfg.seq_length / step
    tflops = model_flops_per_step(model_cfg, global_batch) / step / world / 1e12
    executed = hardware_flops_per_step(model_cfg, global_batch, priced.recompute, assume.flash_attention)
    days = train_tokens / tokens_per_s / 86400 if train_tokens else None
    pipelined = step - terms.bubble - terms.dp_comm - terms.pp_comm - terms.overhead
    return Estimate(
        layout=layout, fits=verdict != "over", tight=verdict in ("tight", "maybe"), memory_gib=mem,
        buffers_gib=buffers, communicators=communicators(layout, model_cfg), gpu_memory_gib=capacity,
        memory_budget_gib=budget, params_per_gpu=params_per_gpu(model_cfg, layout.tp, layout.pp, layout.ep),
        micro_batches=m, terms=terms, compute_efficiency=eff,
        bubble_fraction=terms.bubble / pipelined if pipelined > 0 else 0.0, tokens_per_s=tokens_per_s,
        tflops_per_gpu=tflops, hardware_tflops_per_gpu=executed / step / world / 1e12,
        mfu=tflops / cluster.peak_tflops, days=days, gpu_hours=days * 24 * world if days else None,
        memory_verdict=verdict, near_boundary=near, notes=notes)


def effective_layout(layout: Layout, assume: Assumptions = Assumptions()) -> Layout:
    """The layout as the trainer runs it: `recompute=selective` only drops the s x s attention scores, which a flash
    kernel never stores, so recipes.model runs it as `none` (no recompute) and it costs the same."""
    if layout.recompute == "selective" and assume.flash_attention:
        return replace(layout, recompute="none")
    return layout


def layout_problems(model_cfg, cluster, layout: Layout, global_batch: int) -> list[str]:
    """Why a layout cannot run at all (empty list = it can; the rules are `Layout.problems`). Memory is judged by
    `estimate`, not here."""
    return [str(p) for p in layout.problems(model_cfg, global_batch)]

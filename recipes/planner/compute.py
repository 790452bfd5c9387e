"""Compute time of one micro-batch on the slowest pipeline stage: FLOPs as the kernels execute them, at a GEMM
efficiency that falls off for thin GEMMs and small models, attention at the flash kernels' own efficiency, MoE experts
at theirs (recipes.planner.experts), plus the framework's fixed overhead per layer."""
from __future__ import annotations

from dataclasses import dataclass

from recipes.model.shape import attention_flops_per_step, hardware_flops_per_step
from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.experts import expert_efficiency, expert_flops


def stage_layer_count(num_layers: int, pp: int, depths: int = 0) -> int:
    """Layers of the most loaded pipeline stage under the uniform split; model.mtp's `depths` are layers of the last
    stage, which the partition gives no extra decoder layer (recipes.parallel.partition)."""
    if pp == 1:
        return num_layers + depths
    return max(-(-num_layers // pp), num_layers // pp + depths)


def compute_efficiency(model_cfg, layout: Layout, assume: Assumptions) -> float:
    """Achieved / peak FLOP/s: thinner per-GPU hidden slices (h/t), fewer tokens per micro-batch on a GPU (b s / cp)
    and small hidden sizes (where memory-bound element-wise work weighs more) all lower it."""
    h, s, b = model_cfg.hidden_size, model_cfg.seq_length // layout.cp, layout.micro_batch
    d = h / layout.tp
    return (assume.kernel_efficiency * d / (d + assume.gemm_falloff) * (b * s) / (b * s + assume.gemm_falloff)
            * h / (h + assume.elementwise_hidden))


@dataclass(frozen=True)
class MicroBatchTimes:
    """Seconds of one micro-batch on the slowest stage: the model's forward + backward, the recompute forward, and
    the weight-gradient GEMMs inside `model` (what a zero-bubble schedule defers into the bubble)."""
    model: float
    recompute: float
    weight_grad: float


def micro_batch_seconds(model_cfg, cluster, layout: Layout, priced: Layout, eff: float,
                        assume: Assumptions) -> MicroBatchTimes:
    """One micro-batch on the slowest stage (it sets the pipeline's pace): its FLOPs as the kernels execute them
    (causal attention: half the s x s block under flash kernels, at the attention kernel's efficiency; the rest at the
    GEMM efficiency `eff`) over the TP x CP ranks that share it (the load-balanced CP split gives every rank the same
    causal work), `layer_overhead_s` per layer and pass and `micro_batch_overhead_s` per micro-batch. A GEMM's backward is two GEMMs of its forward's size
    (input and weight gradients), so the weight gradients are a third of the GEMM time; attention has no weights."""
    b, L, D = layout.micro_batch, model_cfg.num_layers, model_cfg.mtp_depths
    n_l = stage_layer_count(L, layout.pp, D)
    share = n_l / (L + D)  # uneven partitions cost here (model.mtp's depths and heads: on the last stage)
    ranks = cluster.peak_tflops * 1e12 * layout.tp * layout.cp
    flash = assume.flash_attention
    attn_rate = ranks * (assume.attention_efficiency if flash else eff)

    def gemm_and_attention(recompute: str) -> tuple[float, float]:
        attention = attention_flops_per_step(model_cfg, b, recompute, flash)
        rest = hardware_flops_per_step(model_cfg, b, recompute, flash) - attention
        if model_cfg.moe is None:
            return share * rest / (ranks * eff), share * attention / attn_rate
        # routed experts at their own GEMM efficiency, on the stage's own MoE layers (recipes.planner.experts)
        stage, total = expert_flops(model_cfg, layout, recompute)
        rank = cluster.peak_tflops * 1e12
        gemm = (share * (rest - total * layout.tp * layout.cp) / (ranks * eff)
                + stage / (rank * expert_efficiency(model_cfg, layout, assume)))
        return gemm, share * attention / attn_rate

    gemm, attention = gemm_and_attention("none")
    model = gemm + attention + 2 * n_l * assume.layer_overhead_s + assume.micro_batch_overhead_s
    again = sum(gemm_and_attention(priced.recompute)) - gemm - attention
    if priced.recompute == "full":
        again += n_l * assume.layer_overhead_s
    return MicroBatchTimes(model=model, recompute=again, weight_grad=gemm / 3)


def column_dgrad_seconds(model_cfg, layout: Layout, eff: float, peak_tflops: float) -> tuple[float, float]:
    """Seconds of the input-gradient GEMMs of the two column-parallel linears (qkv, fc1) of one layer, one
    micro-batch on one rank: what megatron-core's SP re-gather of their inputs overlaps with."""
    h, heads, f = model_cfg.hidden_size, model_cfg.num_attention_heads, model_cfg.ffn_size
    qkv = h * (h + 2 * model_cfg.query_groups * (h // heads))  # weights of the column-parallel attention linear(s)
    if model_cfg.mla is not None:  # MLA's are the up-projections, from the latents (recipes.model.mla)
        mla = model_cfg.mla
        dq = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        qkv = (mla.q_lora_rank or h) * heads * dq + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    fc1 = h * (2 * f if model_cfg.activation == "swiglu" else f)
    tokens = model_cfg.seq_length // layout.cp * layout.micro_batch
    rate = peak_tflops * 1e12 * eff
    return tuple(2.0 * tokens * weights / layout.tp / rate for weights in (qkv, fc1))

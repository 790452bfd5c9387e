"""Memory per GPU of the most loaded rank: model states per ZeRO stage (Rajbhandari et al. 2019), activations per
Korthikanti et al. 2022 Table 2 (generalised to GQA, SwiGLU and flash attention) times the micro-batches the pipeline
schedule holds in flight (recipes.planner.pipeline), buffers (CUDA context, NCCL communicators, DeepSpeed buckets,
ZeRO-3's gathered layers) and the allocator's fragmentation.

Two activation counts bound the truth: Korthikanti's (every tensor the layer saves: the upper bound, what this
project's trainer keeps) and the lean count (`activation_bytes_per_layer(lean=True)`: what a stack keeps that remakes
element-wise outputs instead of saving them). A layout whose upper count is over the device but whose lean count fits
is not called infeasible: published runs (Llama 3 405B at TP8 x PP16 on 80 GB H100s, no recompute) ran there.
"""
from __future__ import annotations

from recipes.model.shape import layer_parameters, moe_layer_parameters, norm_params
from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.context import cp_gathered_kv_bytes
from recipes.planner.experts import load_imbalance, routed_width, stage_layers, stage_parameters
from recipes.planner.pipeline import in_flight

GiB = 1024**3
GB = 1e9  # cluster.gpu_memory_gb is in datasheet (decimal) GB


def zero_model_state_bytes(params: float, dp: int, zero_stage: int, precision: str = "bf16") -> dict[str, float]:
    """Bytes per GPU of parameters, gradients and optimizer states (ZeRO paper, mixed-precision Adam, K = 12).

    fp32 training keeps 4-byte params and grads; plain Adam adds 8 bytes of moments, but DeepSpeed's ZeRO optimizers
    (stage 1-3) also keep their own fp32 partition of the weights (single_partition_of_fp32_groups /
    fp32_partitioned_groups_flat), so K = 12 again there.
    """
    if precision == "fp32":
        pb, gb, ob = 4, 4, (12 if zero_stage >= 1 else 8)
    else:
        pb, gb, ob = 2, 2, 12
    n = max(1, dp)
    return {
        "params": params * pb / (n if zero_stage >= 3 else 1),
        "grads": params * gb / (n if zero_stage >= 2 else 1),
        "optimizer": params * ob / (n if zero_stage >= 1 else 1),
    }


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none", *, ffn: int | None = None,
                               query_groups: int | None = None, gated: bool = False, dropout: bool = True,
                               flash_attention: bool = False, kv_seq: int | None = None, lean: bool = False,
                               attention: tuple[float, float] | None = None) -> float:
    """Activation bytes one transformer layer keeps for backward (16-bit activations), Korthikanti et al. Table 2.

    With the defaults (f = 4h, MHA, gelu, dropout, no flash attention) this is exactly their Table 2. The keyword
    arguments generalise the same per-tensor accounting: GQA shrinks K and V by groups/heads, SwiGLU keeps gate and
    up projections (6f/h instead of 4f/h), no dropout drops the two 1-byte masks (and the attention dropout output),
    a fused flash-attention kernel stores no s x s score matrix. `kv_seq` is the keys each query sees when it differs
    from `seq` (context parallelism: a rank's seq / cp queries score all seq keys).

    `attention` replaces the attention's own tensors, (split by TP, held whole), in units of s b h bytes:
    multi-head latent attention's (`mla_attention_terms`) instead of Q, K, V and the attention output (2 + 4 g/a + 2).

    `lean=True` is the lower bound of what a stack keeps without recomputing any GEMM: it drops the tensors an
    element-wise op remakes from another kept tensor, the two norm outputs (the qkv and fc1 inputs, remade from the
    norm inputs) and the activation function's output (the fc2 input, remade from fc1's output), as megatron-core's
    recompute_modules "layernorm" and "mlp"/"moe_act" and torchtitan's op-level selective checkpointing do.
    """
    s, b, h, a, t = seq, micro_batch, hidden, heads, tp
    kv = kv_seq or s
    f = ffn or 4 * h
    g = query_groups or a
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1)
    # Split across TP ranks: Q, K, V (2 + 4 g/a), attention output = proj input (2), MLP inner activations.
    mlp = (6.0 if gated else 4.0) * f / h - (2.0 * f / h if lean else 0.0)
    attn_split, attn_unsplit = attention or (2 + 4.0 * g / a + 2, 0.0)
    split = attn_split + mlp
    # Not split by TP (unless SP): two norm inputs (4), qkv and fc1 inputs (4), two dropout masks (2).
    unsplit = (4.0 if lean else 8.0) + (2.0 if dropout else 0.0) + attn_unsplit
    score = 0.0
    if not flash_attention and recompute != "selective":
        score = (5.0 if dropout else 2.0) * a * kv / h  # softmax out (2) + dropout mask (1) + dropout out (2)
    if sequence_parallel:
        return sbh * ((unsplit + split) / t + score / t)
    return sbh * (unsplit + split / t + score / t)


# ---------------------------------------------------------------------------------------------------------------------


def device_gib(cluster) -> float:
    """The device's memory in GiB: cluster.gpu_memory_gb is decimal (datasheet) GB, 80 GB = 74.5 GiB."""
    return cluster.gpu_memory_gb * GB / GiB


def deepspeed_bucket_bytes(params: float, zero_stage: int, dp: int, elem_bytes: int,
                           assume: Assumptions = Assumptions()) -> float:
    """Gradient bucket DeepSpeed holds per GPU, read from deepspeed/runtime/zero and measured on CPU
    (`python -m recipes bench zero-memory`): ZeRO-1/2 allocate a reduce_bucket_size buffer (in the gradients' dtype) for
    every backward, two with overlap_comm + contiguous_gradients (stage_1_and_2.py swaps between them while one is
    being reduced), ZeRO-3 one at start-up, whatever the model size; ZeRO-0's all-reduce flattens gradients bucket
    by bucket (at most their size)."""
    if zero_stage in (1, 2) and assume.overlap_comm and assume.contiguous_gradients:
        return 2 * assume.bucket_elements * elem_bytes
    if zero_stage >= 1:
        return assume.bucket_elements * elem_bytes
    if dp > 1:
        return min(params, assume.bucket_elements) * elem_bytes
    return 0.0


def communicators(layout: Layout, model_cfg) -> int:
    """NCCL communicators one rank initialises (torch creates one per process group on first use, each with its own
    buffers): the default group, gradient traffic over the data axis (DP x CP), TP all-reduces, the CP group's K/V
    gathers, the pipeline's two neighbour groups and the tied-embedding group, the model-parallel group DeepSpeed
    reduces the gradient norm over, and under EP the expert-parallel (all-to-all) and expert-data-parallel groups."""
    n = 1 + (layout.data_axis > 1) + (layout.tp > 1) + (layout.cp > 1) + (layout.model_parallel_size > 1)
    n += 2 * (layout.ep > 1)
    if layout.pp > 1:
        n += 2 + bool(model_cfg.tied_embeddings)
    return n


def params_per_gpu(model_cfg, tp: int, pp: int, ep: int = 1) -> float:
    """Parameters held by the most loaded model-parallel rank (first stage: embedding; last: output layer); a MoE
    model's routed experts divided over EP x TP (recipes.planner.experts.stage_parameters)."""
    h = model_cfg.hidden_size
    v = model_cfg.padded_vocab_size(tp)
    layers = sum(stage_parameters(model_cfg, tp, pp, ep))
    first = layers + v * h / tp + (model_cfg.seq_length * h if model_cfg.position_embedding == "learned" else 0)
    # Megatron keeps a copy of a tied embedding on the last stage when pp > 1 (ours: also for model.mtp's depths).
    head = 0 if (model_cfg.tied_embeddings and pp == 1) else v * h / tp
    copy = v * h / tp if (model_cfg.mtp is not None and not model_cfg.tied_embeddings and pp > 1) else 0
    last = layers + norm_params(model_cfg) + head + copy + _depth_parameters(model_cfg, tp, ep)
    return first + (last - layers) if pp == 1 else max(first, last)


def _depth_parameters(model_cfg, tp: int, ep: int) -> float:
    """model.mtp's depths on one rank of the last stage: their layers (routed experts over EP x TP), eh_proj over
    TP, three norms."""
    if model_cfg.mtp is None:
        return 0.0
    h = model_cfg.hidden_size
    (split, replicated), experts = layer_parameters(model_cfg), 0
    if model_cfg.mtp_is_moe:
        split, replicated, experts = moe_layer_parameters(model_cfg)
    per_depth = split / tp + replicated + experts / (ep * tp) + 2 * h * h / tp + 3 * norm_params(model_cfg)
    return model_cfg.mtp_depths * per_depth


def mla_attention_terms(model_cfg, lean: bool = False) -> tuple[float, float]:
    """What an MLA attention keeps for backward, in s b h bytes at 16 bits (recipes.model.mla): split by TP, each
    head's query and key (dn + dr), value (dv) and attention output (dv); held whole on every TP rank (sequence-split
    under SP), the latents: their norms' inputs and outputs (q_lora_rank + kv_lora_rank each, `lean`: the inputs
    only) and the RoPE key (dr). The s x s scores are Korthikanti's term (per head, as for multi-head attention)."""
    mla, h, n = model_cfg.mla, model_cfg.hidden_size, model_cfg.num_attention_heads
    dq = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    split = 2.0 * n * (2 * dq + 2 * mla.v_head_dim) / h
    latents = (mla.q_lora_rank or 0) + mla.kv_lora_rank
    return split, 2.0 * ((1 if lean else 2) * latents + mla.qk_rope_head_dim) / h


def _activation_kwargs(model_cfg, assume: Assumptions, lean: bool = False) -> dict:
    kw = dict(ffn=model_cfg.ffn_size, query_groups=model_cfg.query_groups, gated=model_cfg.activation == "swiglu",
              dropout=assume.dropout, flash_attention=assume.flash_attention)
    if model_cfg.mla is not None:
        kw["attention"] = mla_attention_terms(model_cfg, lean)
    return kw


def activation_bytes(model_cfg, layout: Layout, priced: Layout, m: int, act_bytes: int,
                     assume: Assumptions, lean: bool = False) -> float:
    """Activation bytes of the most loaded stage: the first stage keeps `pipeline.in_flight` micro-batches of its
    layers (1F1B min(p, m); interleaved x (1 + (p-1)/(p v)), Korthikanti et al.); the last stage adds the logits (bf16
    + the fp32 copy of the vocab-parallel loss). Under CP every tensor holds the rank's s / cp tokens, plus the gathered
    K/V. `lean`: the lower bound (see the module docstring)."""
    s, b, h, t = model_cfg.seq_length // layout.cp, layout.micro_batch, model_cfg.hidden_size, layout.tp
    heads, sp, p = model_cfg.num_attention_heads, layout.sequence_parallel, layout.pp
    kw = dict(_activation_kwargs(model_cfg, assume, lean), kv_seq=model_cfg.seq_length, lean=lean)
    kept_kv = cp_gathered_kv_bytes(model_cfg, layout, act_bytes)  # K/V of the other CP ranks, kept for backward
    n_l, n_moe = stage_layers(model_cfg, p)

    def one_layer(recompute: str) -> float:  # the stage's mean layer (dense and MoE layers mixed)
        dense = activation_bytes_per_layer(s, b, h, heads, t, sp, recompute, **kw) * act_bytes / 2
        return dense + n_moe / n_l * moe_extra_activation_bytes(model_cfg, layout, recompute, act_bytes, assume)

    per_layer = one_layer(priced.recompute)
    full_layer = one_layer("none") + kept_kv
    if priced.recompute != "full":
        per_layer += kept_kv
    first = (n_l - min(assume.lighter_first_stage, n_l - 1) * (p > 1)) * per_layer * in_flight(layout, m)
    if priced.recompute == "full":  # the layer being recomputed needs its full activations once
        first += full_layer
    # the last stage: the logits (model.mtp: each depth's too) and the depths' layers (no extra decoder layer)
    D = model_cfg.mtp_depths
    logits = 6.0 * s * b * model_cfg.padded_vocab_size(t) / t * (1 + D)
    last = ((model_cfg.num_layers // p + D) * per_layer + logits) if p > 1 else 0.0
    return max(first + (D * per_layer * in_flight(layout, m) + logits if p == 1 else 0.0), last)


def moe_extra_activation_bytes(model_cfg, layout: Layout, recompute: str, act_bytes: int, assume: Assumptions) -> float:
    """What a MoE layer keeps for backward beyond a dense layer of model.ffn_hidden_size: its experts' inner
    activations as an MLP of `routed_width` (top_k experts, at the busiest rank's imbalance, + the shared expert)
    instead of the dense MLP, and the permuted tokens the experts' fc1 reads (top_k copies of every token, gathered
    over TP, so not split by it). Nothing under full recompute (only the layer input is kept)."""
    if model_cfg.moe is None or recompute == "full":
        return 0.0
    s, b, h, t = model_cfg.seq_length // layout.cp, layout.micro_batch, model_cfg.hidden_size, layout.tp
    imb = load_imbalance(model_cfg, layout.ep, assume)
    per_width = (6.0 if model_cfg.activation == "swiglu" else 4.0) / h  # sbh bytes per unit of MLP width
    inner = per_width * (routed_width(model_cfg, imb) - model_cfg.ffn_size) / t
    permuted = 2.0 * model_cfg.moe.top_k * imb
    return s * b * h * (inner + permuted) * act_bytes / 2


def model_state_bytes(model_cfg, layout: Layout, precision: str) -> dict[str, float]:
    """Parameters, gradients and optimizer states of the most loaded rank: ZeRO shards the dense parameters over
    DP x CP, the routed experts over their expert-data-parallel group (DP x CP / EP)."""
    psi = params_per_gpu(model_cfg, layout.tp, layout.pp, layout.ep)
    experts = stage_parameters(model_cfg, layout.tp, layout.pp, layout.ep)[1]
    dense = zero_model_state_bytes(psi - experts, layout.data_axis, layout.zero_stage, precision)
    routed = zero_model_state_bytes(experts, layout.data_axis // layout.ep, layout.zero_stage, precision)
    return {k: dense[k] + routed[k] for k in dense}


def buffer_bytes(model_cfg, layout: Layout, act_bytes: int, assume: Assumptions) -> dict[str, float]:
    """The CUDA context, NCCL's buffers per communicator, DeepSpeed's buckets and ZeRO-3's gathered layers."""
    gathered = 0.0
    if layout.zero_stage == 3:  # live gathered layer + the prefetched one
        split, rep = layer_parameters(model_cfg)
        gathered = 2 * 2 * (split / layout.tp + rep)
    psi = params_per_gpu(model_cfg, layout.tp, layout.pp, layout.ep)
    return {"cuda_context": assume.cuda_context_gib * GiB,
            "communicators": communicators(layout, model_cfg) * assume.gib_per_communicator * GiB,
            "deepspeed_buckets": deepspeed_bucket_bytes(psi, layout.zero_stage, layout.data_axis, act_bytes, assume),
            "zero3_gathered": gathered}


def memory_per_gpu(model_cfg, layout: Layout, priced: Layout, m: int, precision: str,
                   assume: Assumptions) -> tuple[dict[str, float], dict[str, float]]:
    """(memory_gib, buffers_gib) of the most loaded rank: model states per ZeRO stage, activations, buffers, and the
    allocator's fragmentation on top of them; `total` with Korthikanti's activation count, `total_lean` with the lean
    one (the two bound what a stack needs)."""
    act_bytes = 2 if precision != "fp32" else 4
    states = model_state_bytes(model_cfg, layout, precision)
    buffers = buffer_bytes(model_cfg, layout, act_bytes, assume)
    fixed = sum(states.values()) + sum(buffers.values())
    activations = activation_bytes(model_cfg, layout, priced, m, act_bytes, assume)
    lean = activation_bytes(model_cfg, layout, priced, m, act_bytes, assume, lean=True)
    frag = assume.fragmentation * (fixed + activations)
    mem = {k: v / GiB for k, v in states.items()}
    mem.update(activations=activations / GiB, buffers=sum(buffers.values()) / GiB, fragmentation=frag / GiB,
               total=(fixed + activations) * (1 + assume.fragmentation) / GiB,
               total_lean=(fixed + lean) * (1 + assume.fragmentation) / GiB)
    return mem, {k: v / GiB for k, v in buffers.items()}


def device_memory(cluster) -> str:
    """'80 GB (74.5 GiB)': the device's memory in the cluster's unit and in the GiB every estimate is in."""
    return f"{cluster.gpu_memory_gb:g} GB ({device_gib(cluster):.1f} GiB)"


def format_memory(mem: dict[str, float]) -> str:
    keys = ("params", "grads", "optimizer", "activations", "buffers", "fragmentation")
    return ", ".join(f"{k} {mem[k]:.1f}" for k in keys) + f" = {mem['total']:.1f} GiB"

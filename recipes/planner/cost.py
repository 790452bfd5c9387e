"""Cost model of a training layout: parameters, FLOPs, memory per GPU, communication, bubble, step time, MFU, days.

Everything here is arithmetic on the recipe's model shape, a cluster description and a `Layout`; nothing touches a GPU.
`plan_layouts` enumerates every valid layout for a cluster and ranks them; `recipes.planner.cli` is the CLI around it.

Sources (docs/planner.md shows the checks against their published numbers): parameter and FLOP counts from Narayanan
et al. 2021 (Megatron-LM, Eq. 2 and Eq. 3) and Korthikanti et al. 2022 (model FLOPs, activation memory Table 2);
model-state memory from Rajbhandari et al. 2019 (ZeRO); ring collective costs from nccl-tests PERFORMANCE.md. The assumptions that are ours (efficiencies,
overlap, buffers) live in `Assumptions` and are printed with every plan.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from recipes.model.shape import (
    attention_flops_per_step, hardware_flops_per_step, layer_parameters, model_flops_per_step, norm_params,
)
from recipes.parallel.ds_config import zero_comm_settings
from recipes.parallel.layout import Layout
from recipes.planner.experts import (
    ep_seconds, expert_degrees, expert_efficiency, expert_flops, imbalance_seconds, load_imbalance, routed_width,
    stage_layers, stage_parameters,
)

GiB = 1024**3
GB = 1e9  # cluster.gpu_memory_gb is in datasheet (decimal) GB
# What recipes.parallel.ds_config writes for a GPU run: the planner prices exactly that (overlap, buckets, ZeRO-3 prefetch).
_DS_GPU = zero_comm_settings(3, "cuda")


# ---------------------------------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------------------------------

def megatron_eq2_params(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Narayanan et al. 2021, Eq. 2 (GPT with biases, LayerNorm, learned positions, tied output layer)."""
    l, h = layers, hidden
    return 12 * l * h * h * (1 + 13 / (12 * h) + (vocab + seq) / (12 * l * h))


def megatron_eq3_flops(global_batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021, Eq. 3: FLOPs per iteration including the recompute forward (full recomputation)."""
    B, s, l, h = global_batch, seq, layers, hidden
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + vocab / (16 * l * h))


def korthikanti_model_flops(global_batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Korthikanti et al. 2022: model FLOPs per iteration without recompute (what MFU counts)."""
    B, s, L, h = global_batch, seq, layers, hidden
    return 72 * B * L * s * h * h * (1 + s / (6 * h) + vocab / (12 * h * L))


# ---------------------------------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------------------

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
                               flash_attention: bool = False, kv_seq: int | None = None) -> float:
    """Activation bytes one transformer layer keeps for backward (16-bit activations), Korthikanti et al. Table 2.

    With the defaults (f = 4h, MHA, gelu, dropout, no flash attention) this is exactly their Table 2. The keyword
    arguments generalise the same per-tensor accounting: GQA shrinks K and V by groups/heads, SwiGLU keeps gate and
    up projections (6f/h instead of 4f/h), no dropout drops the two 1-byte masks (and the attention dropout output),
    a fused flash-attention kernel stores no s x s score matrix. `kv_seq` is the keys each query sees when it differs
    from `seq` (context parallelism: a rank's seq / cp queries score all seq keys).
    """
    s, b, h, a, t = seq, micro_batch, hidden, heads, tp
    kv = kv_seq or s
    f = ffn or 4 * h
    g = query_groups or a
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1)
    # Split across TP ranks: Q, K, V (2 + 4 g/a), attention output = proj input (2), MLP inner activations.
    mlp = (6.0 if gated else 4.0) * f / h
    split = 2 + 4.0 * g / a + 2 + mlp
    # Not split by TP (unless SP): two norm inputs (4), qkv and fc1 inputs (4), two dropout masks (2).
    unsplit = 8.0 + (2.0 if dropout else 0.0)
    score = 0.0
    if not flash_attention and recompute != "selective":
        score = (5.0 if dropout else 2.0) * a * kv / h  # softmax out (2) + dropout mask (1) + dropout out (2)
    if sequence_parallel:
        return sbh * ((unsplit + split) / t + score / t)
    return sbh * (unsplit + split / t + score / t)


# ---------------------------------------------------------------------------------------------------------------------
# Assumptions and the per-layout estimate
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Assumptions:
    """Our modelling choices, printed with every plan so a reader can disagree with a number, not a black box."""
    # Compute efficiency = kernel_efficiency x d/(d+gemm_falloff) for the per-GPU hidden slice d = h/t and for the
    # tokens per micro-batch x h/(h+elementwise_hidden) (memory-bound norms, softmax and activations weigh more at
    # small h). The three constants were fitted to Megatron-LM's Table 1 (9 runs, A100): all within 5%.
    kernel_efficiency: float = 0.7
    gemm_falloff: int = 64
    elementwise_hidden: int = 1024
    intra_link_efficiency: float = 0.4  # NCCL bus bandwidth / datasheet NVLink (bidirectional) figure
    inter_link_efficiency: float = 0.8  # NCCL bus bandwidth / InfiniBand line rate per node
    # ZeRO-2 reduce-scatters hide behind the backward only with DeepSpeed's overlap_comm=true (what
    # recipes/parallel/ds_config.py writes for GPU runs): then this share of the backward hides them.
    overlap_comm: bool = _DS_GPU["overlap_comm"]
    contiguous_gradients: bool = _DS_GPU["contiguous_gradients"]  # with overlap_comm: two reduce buckets
    overlap_efficiency: float = 0.8
    latency_intra_s: float = 2e-6  # NCCL latency per ring step over NVLink
    latency_inter_s: float = 5e-6  # NCCL latency per ring step over InfiniBand
    # SDPA/flash kernels on GPU: no s x s score matrix is stored, and causal attention skips the masked upper
    # triangle (half the attention FLOPs). False prices kernels that compute the scores and then mask them.
    flash_attention: bool = True
    # Share of peak the flash attention kernels reach, forward and backward: FlashAttention-2, which torch's SDPA flash
    # backend is built on, reaches 35% of an H100's (Shah et al. 2024, FlashAttention-3, abstract; FA3 reaches 75%,
    # and FA2 reaches more of an A100's). It matters at long context: at 128K attention is most of a small model's
    # FLOPs. Without flash kernels the scores are batched GEMMs at the GEMM efficiency.
    attention_efficiency: float = 0.35
    dropout: bool = False  # recipes.model.layers builds with hidden/attention dropout 0.0
    # Fixed memory per GPU: the CUDA context (lazy module loading) and cuBLAS/cuBLASLt workspaces, then NCCL's buffers
    # per communicator the rank uses (Simple 4 MiB + LL128 ~4.5 MiB + LL per channel and peer, up to 32 channels).
    cuda_context_gib: float = 0.6
    gib_per_communicator: float = 0.3
    bucket_elements: float = _DS_GPU["reduce_bucket_size"]  # DeepSpeed reduce/allgather bucket
    zero3_bucket_elements: float = _DS_GPU["stage3_prefetch_bucket_size"]  # ZeRO-3 prefetches this many elements ahead
    fragmentation: float = 0.05  # allocator fragmentation, as a share of everything else
    # The share of the device's memory (gpu_memory_gb, decimal GB) a recommended layout leaves free: the model above
    # is an estimate, and allocator peaks, NCCL's lazy buffers and other processes need room. Layouts that fit the
    # device but not this margin are listed as "tight" and recommended only when nothing else fits.
    memory_headroom: float = 0.10
    max_micro_batch: int = 16
    # Model chunks per pipeline rank (Megatron's interleaved 1F1B: bubble (p-1)/(v m), v x the sends, more in flight).
    # DeepSpeed's pipeline engine, which recipes.train runs, has 1; other values only price published runs that
    # interleaved (Llama 3 405B: 126 layers in 16 x 8 chunks).
    virtual_stages: int = 1
    # Mixture of experts (recipes.planner.experts): the busiest EP rank receives this many times the mean routed
    # tokens. Our assumption for a router trained with the load-balancing aux loss, not a measurement: training logs
    # the real figure (metrics.jsonl moe_load_imbalance); it prices the all-to-all, the expert GEMMs and activations.
    moe_load_imbalance: float = 1.2

    @classmethod
    def for_device(cls, device_type: str, **changes) -> "Assumptions":
        """The assumptions for runs on `device_type` ("cuda": the defaults; "cpu": what the CPU/gloo runs write),
        with DeepSpeed's settings read from `recipes.parallel.ds_config.zero_comm_settings` like the defaults."""
        ds = zero_comm_settings(3, device_type)
        return cls(**{"overlap_comm": ds["overlap_comm"], "contiguous_gradients": ds["contiguous_gradients"],
                      "bucket_elements": ds["reduce_bucket_size"],
                      "zero3_bucket_elements": ds["stage3_prefetch_bucket_size"], **changes})


@dataclass(frozen=True)
class StepTerms:
    """Seconds of one optimizer step, by priced cause; they add up to `step`. A new kind of parallelism adds its term
    here (a field), its price in `estimate` and its words in `recipes.planner.explain.TERM_WORDS`."""
    compute: float = 0.0  # the model's FLOPs on the slowest pipeline stage, all micro-batches
    recompute: float = 0.0  # the forward again under recompute=full (selective: the attention scores)
    tp_comm: float = 0.0  # tensor-parallel all-reduces, or SP's all-gathers and reduce-scatters (not overlapped)
    cp_comm: float = 0.0  # context-parallel K/V all-gathers and their gradients' reduce-scatters (not overlapped)
    ep_comm: float = 0.0  # MoE dispatch / combine all-to-alls over EP (+ the routed tokens' extra TP traffic)
    imbalance: float = 0.0  # waiting for the busiest EP rank's extra routed tokens (Assumptions.moe_load_imbalance)
    bubble: float = 0.0  # 1F1B fill and drain: (p-1) micro-batch slots
    pp_comm: float = 0.0  # stage-to-stage sends
    dp_comm: float = 0.0  # data-parallel traffic the compute does not hide

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
    fits: bool  # the predicted total is within the device's memory
    tight: bool  # it fits, but inside the stated headroom (Assumptions.memory_headroom)
    memory_gib: dict[str, float]  # params, grads, optimizer, activations, buffers, fragmentation, total
    buffers_gib: dict[str, float]  # what "buffers" holds: cuda_context, communicators, deepspeed_buckets, zero3_gathered
    communicators: int  # NCCL communicators a rank uses (each holds its own buffers)
    gpu_memory_gib: float  # the device's memory: cluster.gpu_memory_gb (decimal GB) in GiB
    memory_budget_gib: float  # gpu_memory_gib less the headroom
    params_per_gpu: float
    micro_batches: int
    terms: StepTerms
    compute_efficiency: float  # achieved / peak FLOP/s of the GEMMs at this micro-batch and TP slice
    bubble_fraction: float
    tokens_per_s: float
    tflops_per_gpu: float  # model TFLOP/s per GPU (no recompute counted)
    hardware_tflops_per_gpu: float
    mfu: float
    days: float | None
    gpu_hours: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def time_s(self) -> dict[str, float]:
        """The step's terms and their sum, in seconds (compute, recompute, tp_comm, cp_comm, ep_comm, imbalance, bubble,
        pp_comm, dp_comm, step)."""
        return self.terms.as_dict()

    @property
    def fits_with_headroom(self) -> bool:
        return self.fits and not self.tight

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = asdict(self.layout)
        d["layout"]["describe"] = self.layout.describe()
        d["time_s"] = self.time_s
        return d


def device_gib(cluster) -> float:
    """The device's memory in GiB: cluster.gpu_memory_gb is decimal (datasheet) GB, 80 GB = 74.5 GiB."""
    return cluster.gpu_memory_gb * GB / GiB


def deepspeed_bucket_bytes(params: float, zero_stage: int, dp: int, elem_bytes: int,
                           assume: Assumptions = Assumptions()) -> float:
    """Gradient bucket DeepSpeed holds per GPU, read from deepspeed/runtime/zero and measured on CPU
    (`python -m recipes measure-zero`): ZeRO-1/2 allocate a reduce_bucket_size buffer (in the gradients' dtype) for
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


def _stage_layers(num_layers: int, pp: int) -> int:
    return -(-num_layers // pp)


def params_per_gpu(model_cfg, tp: int, pp: int, ep: int = 1) -> float:
    """Parameters held by the most loaded model-parallel rank (first stage: embedding; last: output layer); a MoE
    model's routed experts divided over EP x TP (recipes.planner.experts.stage_parameters)."""
    h = model_cfg.hidden_size
    v = model_cfg.padded_vocab_size(tp)
    layers = sum(stage_parameters(model_cfg, tp, pp, ep))
    first = layers + v * h / tp + (model_cfg.seq_length * h if model_cfg.position_embedding == "learned" else 0)
    # Megatron keeps a copy of a tied embedding on the last stage when pp > 1.
    head = 0 if (model_cfg.tied_embeddings and pp == 1) else v * h / tp
    last = layers + norm_params(model_cfg) + head
    return first + (last - layers) if pp == 1 else max(first, last)


def ring_seconds(bytes_: float, n: int, bus_gbps: float, kind: str, *, step_latency_s: float = 0.0,
                 chunk_bytes: float | None = None) -> float:
    """Seconds for a ring collective of `bytes_` over n ranks at `bus_gbps` GB/s bus bandwidth (nccl-tests:
    all-reduce (S/B) 2(n-1)/n, reduce-scatter and all-gather (S/B)(n-1)/n), issued in calls of `chunk_bytes`, each
    call paying one latency per ring step (2(n-1) steps for all-reduce, n-1 otherwise)."""
    if n <= 1 or bytes_ <= 0:
        return 0.0
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    calls = math.ceil(bytes_ / chunk_bytes) if chunk_bytes else 1
    return bytes_ / (bus_gbps * 1e9) * steps / n + calls * steps * step_latency_s


def _group_bus_gbps(cluster, assume: Assumptions, members_per_node: int, spans_nodes: bool) -> float:
    """Bus bandwidth of one collective group. Inside a node: NVLink. Across nodes: the node's NICs, shared by the
    gpus_per_node / members_per_node groups of this kind that run at the same time."""
    intra = cluster.intra_node_gbps * assume.intra_link_efficiency
    if not spans_nodes:
        return intra
    inter = cluster.inter_node_gbps * assume.inter_link_efficiency * members_per_node / cluster.gpus_per_node
    return min(intra, inter)


def _activation_kwargs(model_cfg, assume: Assumptions) -> dict:
    return dict(ffn=model_cfg.ffn_size, query_groups=model_cfg.query_groups, gated=model_cfg.activation == "swiglu",
                dropout=assume.dropout, flash_attention=assume.flash_attention)


def activation_bytes(model_cfg, layout: Layout, priced: Layout, m: int, act_bytes: int,
                     assume: Assumptions) -> float:
    """Activation bytes of the most loaded stage: 1F1B keeps min(p, m) micro-batches in flight on the first stage
    (the interleaved schedule x (1 + (p-1)/(p v)), Korthikanti et al.); the last stage adds the logits (bf16 + the fp32
    copy of the vocab-parallel loss). Under CP every tensor holds the rank's s / cp tokens, plus the gathered K/V."""
    s, b, h, t = model_cfg.seq_length // layout.cp, layout.micro_batch, model_cfg.hidden_size, layout.tp
    heads, sp, p, v = model_cfg.num_attention_heads, layout.sequence_parallel, layout.pp, assume.virtual_stages
    kw = dict(_activation_kwargs(model_cfg, assume), kv_seq=model_cfg.seq_length)
    kept_kv = cp_gathered_kv_bytes(model_cfg, layout, act_bytes)  # K/V of the other CP ranks, kept for backward
    n_l, n_moe = stage_layers(model_cfg, p)

    def one_layer(recompute: str) -> float:  # the stage's mean layer (dense and MoE layers mixed)
        dense = activation_bytes_per_layer(s, b, h, heads, t, sp, recompute, **kw) * act_bytes / 2
        return dense + n_moe / n_l * moe_extra_activation_bytes(model_cfg, layout, recompute, act_bytes, assume)

    per_layer = one_layer(priced.recompute)
    full_layer = one_layer("none") + kept_kv
    if priced.recompute != "full":
        per_layer += kept_kv
    in_flight = min(p, m) * (1 + (p - 1) / (p * v) if v > 1 and m >= p else 1)
    first = n_l * per_layer * in_flight
    if priced.recompute == "full":  # the layer being recomputed needs its full activations once
        first += full_layer
    logits = 6.0 * s * b * model_cfg.padded_vocab_size(t) / t
    last = (n_l * per_layer + logits) if p > 1 else 0.0
    return max(first + (logits if p == 1 else 0.0), last)


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


def memory_per_gpu(model_cfg, layout: Layout, priced: Layout, m: int, precision: str,
                   assume: Assumptions) -> tuple[dict[str, float], dict[str, float]]:
    """(memory_gib, buffers_gib) of the most loaded rank: model states per ZeRO stage, activations, buffers, and the
    allocator's fragmentation on top of them."""
    act_bytes = 2 if precision != "fp32" else 4
    psi = params_per_gpu(model_cfg, layout.tp, layout.pp, layout.ep)
    experts = stage_parameters(model_cfg, layout.tp, layout.pp, layout.ep)[1]
    # ZeRO shards the dense parameters over DP x CP, the experts over their expert-data-parallel group (DP x CP / EP)
    dense = zero_model_state_bytes(psi - experts, layout.data_axis, layout.zero_stage, precision)
    routed = zero_model_state_bytes(experts, layout.data_axis // layout.ep, layout.zero_stage, precision)
    states = {k: dense[k] + routed[k] for k in dense}
    activations = activation_bytes(model_cfg, layout, priced, m, act_bytes, assume)
    gathered = 0.0
    if layout.zero_stage == 3:  # live gathered layer + the prefetched one
        split, rep = layer_parameters(model_cfg)
        gathered = 2 * 2 * (split / layout.tp + rep)
    buffers = {"cuda_context": assume.cuda_context_gib * GiB,
               "communicators": communicators(layout, model_cfg) * assume.gib_per_communicator * GiB,
               "deepspeed_buckets": deepspeed_bucket_bytes(psi, layout.zero_stage, layout.data_axis, act_bytes,
                                                           assume),
               "zero3_gathered": gathered}
    subtotal = sum(states.values()) + activations + sum(buffers.values())
    frag = assume.fragmentation * subtotal
    mem = {k: v / GiB for k, v in states.items()}
    mem.update(activations=activations / GiB, buffers=sum(buffers.values()) / GiB, fragmentation=frag / GiB,
               total=(subtotal + frag) / GiB)
    return mem, {k: v / GiB for k, v in buffers.items()}


def compute_efficiency(model_cfg, layout: Layout, assume: Assumptions) -> float:
    """Achieved / peak FLOP/s: thinner per-GPU hidden slices (h/t), fewer tokens per micro-batch on a GPU (b s / cp)
    and small hidden sizes (where memory-bound element-wise work weighs more) all lower it."""
    h, s, b = model_cfg.hidden_size, model_cfg.seq_length // layout.cp, layout.micro_batch
    d = h / layout.tp
    return (assume.kernel_efficiency * d / (d + assume.gemm_falloff) * (b * s) / (b * s + assume.gemm_falloff)
            * h / (h + assume.elementwise_hidden))


def _micro_batch_seconds(model_cfg, cluster, layout: Layout, priced: Layout, eff: float,
                         assume: Assumptions) -> tuple[float, float]:
    """(model compute, recompute) seconds of one micro-batch on the slowest stage (it sets the pipeline's pace): its
    FLOPs as the kernels execute them (causal attention: half the s x s block under flash kernels, at the attention
    kernel's efficiency; the rest at the GEMM efficiency `eff`) over the TP x CP ranks that share it (the
    load-balanced CP split gives every rank the same causal work)."""
    b, L = layout.micro_batch, model_cfg.num_layers
    share = _stage_layers(L, layout.pp) / L  # uneven partitions cost here
    ranks = cluster.peak_tflops * 1e12 * layout.tp * layout.cp
    flash = assume.flash_attention
    attn_rate = ranks * (assume.attention_efficiency if flash else eff)

    def seconds(recompute: str) -> float:
        attention = attention_flops_per_step(model_cfg, b, recompute, flash)
        rest = hardware_flops_per_step(model_cfg, b, recompute, flash) - attention
        if model_cfg.moe is None:
            return share * (rest / (ranks * eff) + attention / attn_rate)
        # routed experts at their own GEMM efficiency, on the stage's own MoE layers (recipes.planner.experts)
        stage, total = expert_flops(model_cfg, layout, recompute)
        rank = cluster.peak_tflops * 1e12
        return (share * ((rest - total * layout.tp * layout.cp) / (ranks * eff) + attention / attn_rate)
                + stage / (rank * expert_efficiency(model_cfg, layout, assume)))

    model = seconds("none")
    return model, seconds(priced.recompute) - model


@dataclass(frozen=True)
class _Link:
    """One process group's collectives: n ranks at bus_gbps, latency_s per ring step (nccl-tests ring formulas)."""
    n: int
    bus_gbps: float
    latency_s: float

    def seconds(self, nbytes: float, kind: str, calls: float = 1.0) -> float:
        if self.n <= 1 or nbytes <= 0:
            return 0.0
        steps = 2 * (self.n - 1) if kind == "all_reduce" else self.n - 1
        return nbytes / (self.bus_gbps * 1e9) * steps / self.n + calls * steps * self.latency_s


def _strided_link(cluster, n: int, stride: int, assume: Assumptions) -> _Link:
    """A group of n ranks `stride` global ranks apart (rank order TP, CP, DP, PP: a CP group is TP apart, the data
    axis DP x CP too). Across nodes each member gets its share of the node's NICs: every GPU of a node is in a group
    of this kind, all of them communicating at once."""
    gpn = cluster.gpus_per_node
    per_node = max(1, min(n, gpn // stride)) if stride <= gpn else 1
    spans = stride * n > gpn
    return _Link(n, _group_bus_gbps(cluster, assume, per_node, spans),
                 assume.latency_inter_s if spans else assume.latency_intra_s)


def _column_dgrad_seconds(model_cfg, layout: Layout, eff: float, peak_tflops: float) -> tuple[float, float]:
    """Seconds of the input-gradient GEMMs of the two column-parallel linears (qkv, fc1) of one layer, one
    micro-batch on one rank: what megatron-core's SP re-gather of their inputs overlaps with."""
    h, heads, f = model_cfg.hidden_size, model_cfg.num_attention_heads, model_cfg.ffn_size
    qkv_out = h + 2 * model_cfg.query_groups * (h // heads)
    fc1_out = 2 * f if model_cfg.activation == "swiglu" else f
    tokens = model_cfg.seq_length // layout.cp * layout.micro_batch
    rate = peak_tflops * 1e12 * eff
    return tuple(2.0 * tokens * h * out / layout.tp / rate for out in (qkv_out, fc1_out))


def _tp_link(cluster, layout: Layout, assume: Assumptions) -> _Link:
    t = layout.tp
    spans = t > cluster.gpus_per_node
    return _Link(t, _group_bus_gbps(cluster, assume, min(t, cluster.gpus_per_node), spans),
                 assume.latency_inter_s if spans else assume.latency_intra_s)


def _tp_seconds(model_cfg, cluster, layout: Layout, priced: Layout, act_bytes: int, assume: Assumptions,
                eff: float, notes: list[str]) -> float:
    """Tensor-parallel collectives of one micro-batch on the slowest stage, as megatron-core runs them. Without SP:
    two all-reduces per layer forward (row-parallel outputs) and two backward (column-parallel input gradients),
    two more under full recompute (its forward runs again). With SP each all-reduce is an all-gather + a
    reduce-scatter of the same volume (the ring all-reduce is exactly those two); the backward also all-gathers the
    column-parallel inputs again for their weight gradients (SP saves only the rank's slice), overlapped with the
    input-gradient GEMM: its part that GEMM does not hide counts. Priced on the critical path otherwise (megatron-core
    issues the backward input-gradient reductions async beside the weight-gradient GEMM: a conservative price)."""
    t = layout.tp
    if t <= 1:
        return 0.0
    spans = t > cluster.gpus_per_node
    link = _tp_link(cluster, layout, assume)
    if spans:
        notes.append("TP crosses nodes: its collectives run over InfiniBand")
    full = model_cfg.seq_length // layout.cp * layout.micro_batch * model_cfg.hidden_size * act_bytes
    passes = 3 if priced.recompute == "full" else 2  # forward, backward (+ the recompute forward)
    n_l = _stage_layers(model_cfg.num_layers, layout.pp)
    if not layout.sequence_parallel:
        return n_l * passes * 2 * link.seconds(full, "all_reduce")
    pairs = passes * 2 * (link.seconds(full, "all_gather") + link.seconds(full, "reduce_scatter"))
    gather = link.seconds(full, "all_gather")
    regather = sum(max(0.0, gather - assume.overlap_efficiency * dgrad)
                   for dgrad in _column_dgrad_seconds(model_cfg, layout, eff, cluster.peak_tflops))
    return n_l * (pairs + regather)


def _pp_seconds(model_cfg, cluster, layout: Layout, m: int, act_bytes: int, assume: Assumptions) -> float:
    """Pipeline p2p: activations forward, gradients backward, per micro-batch (v times with v model chunks per
    rank), not overlapped. A message is one micro-batch's s / cp tokens (/ t under SP)."""
    p, t, v = layout.pp, layout.tp, assume.virtual_stages
    if p <= 1:
        return 0.0
    spans = t * layout.cp * layout.dp >= cluster.gpus_per_node  # neighbouring stages sit t*cp*dp ranks apart
    # Across nodes every GPU sends its own p2p at the same time: each gets its share of the node's NICs.
    bw = _group_bus_gbps(cluster, assume, 1, spans)
    msg = model_cfg.seq_length // layout.cp * layout.micro_batch * model_cfg.hidden_size * act_bytes / (
        t if layout.sequence_parallel else 1)
    lat = assume.latency_inter_s if spans else assume.latency_intra_s
    return 2 * (v * m + p - 2) * (msg / (bw * 1e9) + lat)


def _dp_link(cluster, layout: Layout, assume: Assumptions) -> _Link:
    """The data axis DeepSpeed reduces gradients and shards ZeRO over: DP x CP ranks, TP apart."""
    return _strided_link(cluster, layout.data_axis, layout.tp, assume)


# ---------------------------------------------------------------------------------------------------------------------
# Context parallelism (recipes.model.context_attention): its own terms, so other kinds of parallelism add theirs
# ---------------------------------------------------------------------------------------------------------------------

def cp_kv_bytes(model_cfg, layout: Layout, act_bytes: int) -> float:
    """Bytes of one layer's gathered keys and values on one rank: the whole sequence's K and V of this TP rank's
    query groups (the all-gather's output; the reduce-scatter of their gradients moves the same)."""
    head_dim = model_cfg.hidden_size // model_cfg.num_attention_heads
    groups = model_cfg.query_groups / layout.tp
    return model_cfg.seq_length * layout.micro_batch * 2 * groups * head_dim * act_bytes


def cp_gathered_kv_bytes(model_cfg, layout: Layout, act_bytes: int) -> float:
    """Activation bytes a layer keeps for backward beyond its own chunks under CP: the other ranks' K and V, which
    the attention kernel saves (the local share is already in the per-layer activations)."""
    if layout.cp <= 1:
        return 0.0
    return cp_kv_bytes(model_cfg, layout, act_bytes) * (1 - 1 / layout.cp)


def _cp_link(cluster, layout: Layout, assume: Assumptions) -> _Link:
    return _strided_link(cluster, layout.cp, layout.tp, assume)


def cp_seconds(model_cfg, cluster, layout: Layout, priced: Layout, act_bytes: int, assume: Assumptions) -> float:
    """CP collectives of one micro-batch on the slowest stage, as recipes.model.context_attention runs them: per
    layer one all-gather of K and V (one collective for both) in the forward, again in the recompute forward under
    full recompute, and one reduce-scatter of their gradients in the backward. None is overlapped with compute (a
    ring would hide its transfers behind blocks of attention; the gather keeps document masks simple, Llama 3's
    choice), so all of it is on the critical path."""
    if layout.cp <= 1:
        return 0.0
    link = _cp_link(cluster, layout, assume)
    kv = cp_kv_bytes(model_cfg, layout, act_bytes)
    gathers = 2 if priced.recompute == "full" else 1
    per_layer = gathers * link.seconds(kv, "all_gather") + link.seconds(kv, "reduce_scatter")
    return _stage_layers(model_cfg.num_layers, layout.pp) * per_layer


def zero3_modules(model_cfg, tp: int, causal: bool = False) -> tuple[list, list, list]:
    """The modules ZeRO-3 fetches one by one in a forward pass, as (parameters per GPU, share of the forward FLOPs):
    (before the layers, one decoder layer, after the layers). recipes/parallel/ds_config.py sets
    stage3_param_persistence_threshold 0, so every module with parameters (norms included) is gathered before it
    runs and released after."""
    h, heads, L = model_cfg.hidden_size, model_cfg.num_attention_heads, model_cfg.num_layers
    f, s = model_cfg.ffn_size, model_cfg.seq_length
    qkv = h * (h + 2 * model_cfg.query_groups * (h // heads))
    fc1 = h * f * (2 if model_cfg.activation == "swiglu" else 1)
    vocab = model_cfg.padded_vocab_size(tp) * h
    norm = norm_params(model_cfg)
    attention = 2 * s * h * (0.5 if causal else 1.0)  # QK^T and scores x V per token, with the projection after
    total = L * (qkv + h * h + attention + fc1 + f * h) + vocab
    layer = [(norm, 0.0), (qkv / tp, qkv / total), (h * h / tp, (h * h + attention) / total), (norm, 0.0),
             (fc1 / tp, fc1 / total), (f * h / tp, f * h / total)]
    head = 0.0 if model_cfg.tied_embeddings else vocab / tp
    return [(vocab / tp, 0.0)], layer, [(norm, 0.0), (head, vocab / total)]


class _FetchPass:
    """One pass over modules as DeepSpeed's ZeRO-3 coordinator runs it: when module k starts, it prefetches the
    modules after it until their parameters reach the prefetch bucket (at least the next one, even when that alone
    exceeds it); fetches run one after another on the communication stream; module k computes once it is fetched and
    the one before it is done."""

    def __init__(self, bucket_elements: float):
        self.bucket = bucket_elements
        self.comm_free = self.compute_end = self.work = 0.0
        self.starts: list[float] = []
        self.elems: list[float] = []
        self.reach = 1  # the furthest back (in modules) a fetch has been issued from

    def _issued_at(self, j: int) -> float:
        """When module j's fetch can be issued: the start of the earliest module k < j whose prefetch reaches it
        (the modules strictly between k and j hold fewer elements than the bucket)."""
        if j == 0:
            return 0.0
        k, between = j - 1, 0.0
        while k > 0 and between + self.elems[k] < self.bucket:
            between += self.elems[k]
            k -= 1
        self.reach = max(self.reach, j - k)
        return self.starts[k]

    def run(self, modules: list[tuple[float, float, float]]) -> None:
        """modules: (elements, fetch seconds, compute seconds) in the order they run."""
        for elems, fetch, work in modules:
            j = len(self.starts)
            self.elems.append(elems)
            self.comm_free = max(self.comm_free, self._issued_at(j)) + fetch
            self.starts.append(max(self.compute_end, self.comm_free))
            self.compute_end = self.starts[-1] + work
            self.work += work

    @property
    def waited(self) -> float:
        return max(self.compute_end, self.comm_free) - self.work

    def state(self) -> tuple:
        """Everything the next modules' times depend on, relative to now (the end of the last compute)."""
        t = self.compute_end
        return (self.comm_free - t,) + tuple(x - t for x in self.starts[-(self.reach + 1):])


def _same_state(a: tuple, b: tuple, scale: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-12 * (1.0 + scale) for x, y in zip(a, b))


def _pass_wait(before: list, layer: list, after: list, layers: int, bucket_elements: float) -> float:
    """Seconds waited over [before, layer x layers, after]. The layers are identical: once a layer leaves the pass in
    the same state (relative to its end) as the layer before it did, every later layer repeats it shifted in time, so
    the rest are counted at that layer's wait instead of simulated (exact)."""
    sim = _FetchPass(bucket_elements)
    sim.run(before)
    previous = None
    for done in range(1, layers + 1):
        waited = sim.waited
        sim.run(layer)
        state = sim.state()
        if previous is not None and _same_state(state, previous, sim.compute_end):
            per_layer = sim.waited - waited
            sim.run(after)
            return sim.waited + (layers - done) * per_layer
        previous = state
    sim.run(after)
    return sim.waited


def zero3_exposed_seconds(model_cfg, layout: Layout, link: _Link, t_model_mb: float, t_recompute_mb: float,
                          act_bytes: int, assume: Assumptions) -> float:
    """ZeRO-3's wait per micro-batch, module by module: each module's weights are all-gathered (one collective,
    one latency per ring step) before its forward and again before its backward, its gradients reduce-scattered
    after its backward (in reduce buckets); a fetch hides behind the modules running before it, as far as the
    prefetch bucket reaches. What is left waits: the first fetches, and every fetch slower than the compute it
    overlaps."""
    parts = zero3_modules(model_cfg, layout.tp, assume.flash_attention)
    bwd_work = t_model_mb * 2 / 3 + t_recompute_mb

    def forward(mods):
        return [(e, link.seconds(e * act_bytes, "all_gather"), x * t_model_mb / 3) for e, x in mods]

    def backward(mods):  # in reverse; the gradients' reduce-scatter shares the link with the next fetches
        return [(e, link.seconds(e * act_bytes, "all_gather")
                 + link.seconds(e * act_bytes, "reduce_scatter", calls=e / assume.bucket_elements), x * bwd_work)
                for e, x in mods[::-1]]

    L, bucket = model_cfg.num_layers, assume.zero3_bucket_elements
    return (_pass_wait(*map(forward, parts), L, bucket)
            + _pass_wait(*map(backward, parts[::-1]), L, bucket))


def _dp_exposed_seconds(model_cfg, cluster, layout: Layout, m: int, t_model_mb: float, t_recompute_mb: float,
                        act_bytes: int, assume: Assumptions) -> float:
    """Data-parallel traffic per step that the compute does not hide, by ZeRO stage, over the data axis DP x CP; a MoE
    model's routed experts over their expert-data-parallel group (DP x CP / EP ranks, TP x EP apart) after the rest
    (DeepSpeed reduces the two param groups one after the other)."""
    if layout.data_axis <= 1:
        return 0.0
    link = _dp_link(cluster, layout, assume)
    if layout.zero_stage == 3:
        return m * zero3_exposed_seconds(model_cfg, layout, link, t_model_mb, t_recompute_mb, act_bytes, assume)
    psi = params_per_gpu(model_cfg, layout.tp, layout.pp, layout.ep)
    experts = stage_parameters(model_cfg, layout.tp, layout.pp, layout.ep)[1]
    backward = t_model_mb * 2 / 3 + t_recompute_mb
    edp = _strided_link(cluster, layout.data_axis // layout.ep, layout.tp * layout.ep, assume)
    z = layout.zero_stage
    return (_zero_traffic_seconds(link, psi - experts, act_bytes, m, backward, z, assume)
            + _zero_traffic_seconds(edp, experts, act_bytes, m, backward, z, assume))


def _zero_traffic_seconds(link: _Link, params: float, act_bytes: int, m: int, backward_s: float, z: int,
                          assume: Assumptions) -> float:
    """ZeRO-0/1/2 traffic of `params` gradients per rank over `link` that the compute (`backward_s` a micro-batch)
    does not hide."""
    if link.n <= 1 or params <= 0:
        return 0.0
    grad_bytes = params * act_bytes
    chunk = assume.bucket_elements * act_bytes
    calls = math.ceil(grad_bytes / chunk)
    if z in (0, 1):  # one all-reduce (ZeRO-1: reduce-scatter + all-gather, the same volume) after the last backward
        return link.seconds(grad_bytes, "all_reduce", calls)
    # ZeRO-2: a reduce-scatter every micro-batch (hidden by its backward with overlap_comm) + one all-gather
    rs = link.seconds(grad_bytes, "reduce_scatter", calls)
    window = min(rs, backward_s * assume.overlap_efficiency) if assume.overlap_comm else 0.0
    return m * (rs - window) + link.seconds(grad_bytes, "all_gather", calls)


def estimate(model_cfg, cluster, layout: Layout, global_batch: int, *, precision: str = "bf16",
             train_tokens: float | None = None, assume: Assumptions = Assumptions()) -> Estimate:
    """Memory, time and throughput of one layout. Pure arithmetic; valid only for layouts `layout_problems` accepts."""
    priced = effective_layout(layout, assume)  # the layout's own settings are reported; costs are of what runs
    p, m = layout.pp, global_batch // (layout.micro_batch * layout.dp)
    act_bytes = 2 if precision != "fp32" else 4
    notes: list[str] = []
    mem, buffers = memory_per_gpu(model_cfg, layout, priced, m, precision, assume)
    capacity = device_gib(cluster)
    budget = capacity * (1 - assume.memory_headroom)

    eff = compute_efficiency(model_cfg, layout, assume)
    t_model, t_recompute = _micro_batch_seconds(model_cfg, cluster, layout, priced, eff, assume)
    t_tp = _tp_seconds(model_cfg, cluster, layout, priced, act_bytes, assume, eff, notes)
    t_cp = cp_seconds(model_cfg, cluster, layout, priced, act_bytes, assume)
    t_ep = ep_seconds(model_cfg, cluster, layout, priced, act_bytes, assume, _tp_link(cluster, layout, assume))
    t_wait = imbalance_seconds(model_cfg, cluster, layout, priced, assume)
    v = assume.virtual_stages
    terms = StepTerms(
        compute=m * t_model, recompute=m * t_recompute, tp_comm=m * t_tp, cp_comm=m * t_cp, ep_comm=m * t_ep,
        imbalance=m * t_wait, bubble=(p - 1) / v * (t_model + t_recompute + t_tp + t_cp + t_ep + t_wait),
        pp_comm=_pp_seconds(model_cfg, cluster, layout, m, act_bytes, assume),
        dp_comm=_dp_exposed_seconds(model_cfg, cluster, layout, m, t_model, t_recompute, act_bytes, assume))

    step = terms.step
    world = layout.world_size
    tokens_per_s = global_batch * model_cfg.seq_length / step
    tflops = model_flops_per_step(model_cfg, global_batch) / step / world / 1e12
    executed = hardware_flops_per_step(model_cfg, global_batch, priced.recompute, assume.flash_attention)
    hw = executed / step / world / 1e12
    days = gpu_hours = None
    if train_tokens:
        days = train_tokens / tokens_per_s / 86400
        gpu_hours = days * 24 * world
    return Estimate(
        layout=layout, fits=mem["total"] <= capacity, tight=budget < mem["total"] <= capacity, memory_gib=mem,
        buffers_gib=buffers, communicators=communicators(layout, model_cfg), gpu_memory_gib=capacity,
        memory_budget_gib=budget, params_per_gpu=params_per_gpu(model_cfg, layout.tp, layout.pp, layout.ep),
        micro_batches=m,
        terms=terms, compute_efficiency=eff, bubble_fraction=(p - 1) / (v * m), tokens_per_s=tokens_per_s,
        tflops_per_gpu=tflops, hardware_tflops_per_gpu=hw, mfu=tflops * 1e12 / (cluster.peak_tflops * 1e12),
        days=days, gpu_hours=gpu_hours, notes=notes)


# ---------------------------------------------------------------------------------------------------------------------
# Layout search
# ---------------------------------------------------------------------------------------------------------------------

def layout_problems(model_cfg, cluster, layout: Layout, global_batch: int) -> list[str]:
    """Why a layout cannot run at all (empty list = it can; the rules are `Layout.problems`). Memory is judged by
    `estimate`, not here."""
    return [str(p) for p in layout.problems(model_cfg, global_batch)]


def effective_layout(layout: Layout, assume: Assumptions = Assumptions()) -> Layout:
    """The layout as the trainer runs it: `recompute=selective` only drops the s x s attention scores, which a flash
    kernel never stores, so recipes.model runs it as `none` (no recompute) and it costs the same."""
    if layout.recompute == "selective" and assume.flash_attention:
        return replace(layout, recompute="none")
    return layout


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


CP_SEARCH_FROM = 8192  # sequence length from which the search tries context parallelism
CP_MIN_TOKENS = 2048  # the search stops splitting a sequence below this many tokens per CP rank (thin GEMMs)


def cp_degrees(model_cfg, ranks: int) -> list[int]:
    """CP degrees the search tries with `ranks` GPUs left for CP x PP x DP: 1 below CP_SEARCH_FROM tokens; from there
    every divisor that splits the sequence into 2 x cp equal chunks of at least CP_MIN_TOKENS / 2 tokens."""
    s = model_cfg.seq_length
    if s < CP_SEARCH_FROM:
        return [1]
    return [c for c in _divisors(ranks) if s % (2 * c) == 0 and s // c >= CP_MIN_TOKENS]


def candidate_layouts(model_cfg, cluster, global_batch: int, assume: Assumptions = Assumptions()) -> list[Layout]:
    """Every layout worth pricing: TP within a node, CP from 8K tokens (`cp_degrees`), any PP that divides the rest,
    EP for a MoE model (every degree dividing the experts and DP x CP, inside a node or across), ZeRO 0-3 (2/3 only without PP), power-of-two micro-batches, the recompute modes that differ (selective only
    without flash attention), SP whenever TP > 1 (the same volume as TP's all-reduces, less memory)."""
    world = cluster.world_size
    out = []
    for t in _divisors(cluster.gpus_per_node):
        if world % t:
            continue
        for c in cp_degrees(model_cfg, world // t):
            for p in _divisors(world // (t * c)):
                if p > model_cfg.num_layers:
                    break
                out += _layouts_at(model_cfg, global_batch, t, c, p, world // (t * c * p), assume)
    return out


def _layouts_at(model_cfg, global_batch: int, t: int, c: int, p: int, dp: int, assume: Assumptions) -> list[Layout]:
    """The valid layouts with these degrees: EP (a MoE model: `expert_degrees`), ZeRO stages, micro-batches and
    recompute modes."""
    out = []
    for e, z in ((e, z) for e in expert_degrees(model_cfg, dp * c) for z in ((0, 1, 2, 3) if p == 1 else (0, 1))):
        b = 1
        while b <= min(assume.max_micro_batch, global_batch // dp):
            for r in ("none", "selective", "full"):
                lay = Layout(tp=t, cp=c, pp=p, dp=dp, zero_stage=z, micro_batch=b, sequence_parallel=t > 1,
                             recompute=r, ep=e)
                if effective_layout(lay, assume) != lay:
                    continue  # runs as another candidate: listing it would show the same layout twice
                if not lay.problems(model_cfg, global_batch):
                    out.append(lay)
            b *= 2
    return out


def _rank_key(e: Estimate):
    return (not e.fits, e.tight, -e.tokens_per_s, e.memory_gib["total"])


def plan_layouts(model_cfg, cluster, global_batch: int, *, precision: str = "bf16", train_tokens: float | None = None,
                 assume: Assumptions = Assumptions()) -> list[Estimate]:
    """All candidate layouts priced and ranked: layouts that fit with the headroom first, then tight ones, then
    those over the device's memory; fastest first within each. A layout that differs from
    an earlier candidate only in a setting that changes nothing here (e.g. ZeRO-2 vs ZeRO-1 at DP=1: the same
    memory and time) is listed once, as the simpler one."""
    ests, seen = [], set()
    for lay in candidate_layouts(model_cfg, cluster, global_batch, assume):
        e = estimate(model_cfg, cluster, lay, global_batch, precision=precision, train_tokens=train_tokens,
                     assume=assume)
        key = _same_cost_key(e)
        if key not in seen:
            seen.add(key)
            ests.append(e)
    ests.sort(key=_rank_key)
    return ests


def listed_rank(est: Estimate, ests: list[Estimate]) -> int | None:
    """1-based rank of `est` in a `plan_layouts` list, also when it is listed as its same-cost twin (a recipe's
    ZeRO-2 at DP=1 is listed as ZeRO-1, its selective recompute under flash attention as none)."""
    key = _same_cost_key(est)
    return next((i for i, e in enumerate(ests, 1) if _same_cost_key(e) == key), None)


def _same_cost_key(e: Estimate) -> tuple:
    """Degrees and micro-batch plus every priced figure: equal keys = the same layout priced twice."""
    lay = e.layout
    figures = sorted(e.memory_gib.items()) + sorted(e.time_s.items())
    return (lay.tp, lay.cp, lay.ep, lay.pp, lay.dp, lay.micro_batch, lay.sequence_parallel,
            tuple((k, round(v, 9)) for k, v in figures))


def what_would_fit(model_cfg, cluster, global_batch: int, *, precision: str = "bf16",
                   assume: Assumptions = Assumptions(), max_nodes: int = 4096) -> str:
    """A sentence telling the user what would make some layout fit: more nodes, or a bigger GPU."""
    ests = plan_layouts(model_cfg, cluster, global_batch, precision=precision, assume=assume)
    if not ests:
        return (f"tp must divide the heads ({model_cfg.num_attention_heads}), the query groups "
                f"({model_cfg.query_groups}) and gpus_per_node ({cluster.gpus_per_node}); pp <= layers "
                f"({model_cfg.num_layers}); and global batch {global_batch} must be a multiple of micro-batch x dp "
                f"with tp x pp x dp = {cluster.world_size}: pick a global batch that is a multiple of the GPU count")
    smallest = min(ests, key=lambda e: e.memory_gib["total"])
    # the stages actually searched: a MoE model never gets ZeRO-3 (refused with experts), a pipeline never ZeRO-2/3
    tried = f"ZeRO-{max(e.layout.zero_stage for e in ests)}, full recompute, micro-batch 1" + (
        f" and CP up to {max(e.layout.cp for e in ests)}" if model_cfg.seq_length >= CP_SEARCH_FROM else "")
    msg = (f"the leanest layout searched ({smallest.layout.describe()}; {tried} were all tried) needs "
           f"{smallest.memory_gib['total']:.1f} GiB per GPU "
           f"({format_memory(smallest.memory_gib)}) but each {cluster.gpu} has {device_memory(cluster)}")
    nodes = cluster.nodes
    while nodes < max_nodes:
        nodes *= 2
        bigger = cluster.model_copy(update={"nodes": nodes})
        if any(e.fits for e in plan_layouts(model_cfg, bigger, global_batch, precision=precision, assume=assume)[:1]):
            msg += f"; with {nodes} nodes ({nodes * cluster.gpus_per_node} GPUs) a layout fits"
            break
    return msg


def device_memory(cluster) -> str:
    """'80 GB (74.5 GiB)': the device's memory in the cluster's unit and in the GiB every estimate is in."""
    return f"{cluster.gpu_memory_gb:g} GB ({device_gib(cluster):.1f} GiB)"


def format_memory(mem: dict[str, float]) -> str:
    keys = ("params", "grads", "optimizer", "activations", "buffers", "fragmentation")
    return ", ".join(f"{k} {mem[k]:.1f}" for k in keys) + f" = {mem['total']:.1f} GiB"

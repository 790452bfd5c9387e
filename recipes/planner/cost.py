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
from dataclasses import asdict, dataclass, field, replace

from recipes.model.shape import hardware_flops_per_step, layer_parameters, model_flops_per_step, norm_params
from recipes.parallel.ds_config import zero_comm_settings
from recipes.parallel.layout import Layout

GiB = 1024**3
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
                               flash_attention: bool = False) -> float:
    """Activation bytes one transformer layer keeps for backward (16-bit activations), Korthikanti et al. Table 2.

    With the defaults (f = 4h, MHA, gelu, dropout, no flash attention) this is exactly their Table 2. The keyword
    arguments generalise the same per-tensor accounting: GQA shrinks K and V by groups/heads, SwiGLU keeps gate and
    up projections (6f/h instead of 4f/h), no dropout drops the two 1-byte masks (and the attention dropout output),
    a fused flash-attention kernel stores no s x s score matrix.
    """
    s, b, h, a, t = seq, micro_batch, hidden, heads, tp
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
        score = (5.0 if dropout else 2.0) * a * s / h  # softmax out (2) + dropout mask (1) + dropout out (2)
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
    zero3_overlap: float = 0.5  # ZeRO-3 fetches weights module by module with a bounded prefetch: half hidden
    latency_intra_s: float = 2e-6  # NCCL latency per ring step over NVLink
    latency_inter_s: float = 5e-6  # NCCL latency per ring step over InfiniBand
    flash_attention: bool = True  # SDPA/flash kernels on GPU: no s x s score matrix is stored
    dropout: bool = False  # recipes.model.layers builds with hidden/attention dropout 0.0
    context_gib: float = 1.5  # CUDA context, cuBLAS workspace, NCCL buffers per GPU
    bucket_elements: float = _DS_GPU["reduce_bucket_size"]  # DeepSpeed reduce/allgather bucket
    zero3_bucket_elements: float = _DS_GPU["stage3_prefetch_bucket_size"]  # ZeRO-3 gathers in prefetch buckets
    fragmentation: float = 0.05  # allocator fragmentation, as a share of everything else
    max_micro_batch: int = 16

    @classmethod
    def for_device(cls, device_type: str, **changes) -> "Assumptions":
        """The assumptions for runs on `device_type` ("cuda": the defaults; "cpu": what the CPU/gloo runs write),
        with DeepSpeed's settings read from `recipes.parallel.ds_config.zero_comm_settings` like the defaults."""
        ds = zero_comm_settings(3, device_type)
        return cls(**{"overlap_comm": ds["overlap_comm"], "contiguous_gradients": ds["contiguous_gradients"],
                      "bucket_elements": ds["reduce_bucket_size"],
                      "zero3_bucket_elements": ds["stage3_prefetch_bucket_size"], **changes})


@dataclass
class Estimate:
    layout: Layout
    fits: bool
    memory_gib: dict[str, float]  # params, grads, optimizer, activations, buffers, fragmentation, total
    gpu_memory_gib: float
    params_per_gpu: float
    micro_batches: int
    time_s: dict[str, float]  # compute, tp_comm, bubble, pp_comm, dp_comm (exposed), step
    bubble_fraction: float
    tokens_per_s: float
    tflops_per_gpu: float  # model TFLOP/s per GPU (no recompute counted)
    hardware_tflops_per_gpu: float
    mfu: float
    days: float | None
    gpu_hours: float | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = asdict(self.layout)
        d["layout"]["describe"] = self.layout.describe()
        return d


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


def _stage_layers(num_layers: int, pp: int) -> int:
    return -(-num_layers // pp)


def params_per_gpu(model_cfg, tp: int, pp: int) -> float:
    """Parameters held by the most loaded model-parallel rank (first stage: embedding; last: output layer)."""
    h = model_cfg.hidden_size
    v = model_cfg.padded_vocab_size(tp)
    split, replicated = layer_parameters(model_cfg)
    layers = _stage_layers(model_cfg.num_layers, pp) * (split / tp + replicated)
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


def estimate(model_cfg, cluster, layout: Layout, global_batch: int, *, precision: str = "bf16",
             train_tokens: float | None = None, assume: Assumptions = Assumptions()) -> Estimate:
    """Memory, time and throughput of one layout. Pure arithmetic; valid only for layouts `layout_problems` accepts."""
    priced = effective_layout(layout, assume)  # the layout's own settings are reported; costs are of what runs
    t, p, n_dp, b = layout.tp, layout.pp, layout.dp, layout.micro_batch
    s, h, L = model_cfg.seq_length, model_cfg.hidden_size, model_cfg.num_layers
    gpn = cluster.gpus_per_node
    world = layout.world_size
    m = global_batch // (b * n_dp)
    notes: list[str] = []
    act_bytes = 2 if precision != "fp32" else 4

    # --- memory per GPU --------------------------------------------------------------------------------------------
    psi = params_per_gpu(model_cfg, t, p)
    states = zero_model_state_bytes(psi, n_dp, layout.zero_stage, precision)
    per_layer = activation_bytes_per_layer(
        s, b, h, model_cfg.num_attention_heads, t, layout.sequence_parallel, priced.recompute,
        ffn=model_cfg.ffn_size, query_groups=model_cfg.query_groups, gated=model_cfg.activation == "swiglu",
        dropout=assume.dropout, flash_attention=assume.flash_attention) * act_bytes / 2
    n_l = _stage_layers(L, p)
    in_flight = min(p, m)  # 1F1B: the first stage holds up to p micro-batches
    first_act = n_l * per_layer * in_flight
    if priced.recompute == "full":  # the layer being recomputed needs its full activations once
        first_act += activation_bytes_per_layer(
            s, b, h, model_cfg.num_attention_heads, t, layout.sequence_parallel, "none", ffn=model_cfg.ffn_size,
            query_groups=model_cfg.query_groups, gated=model_cfg.activation == "swiglu", dropout=assume.dropout,
            flash_attention=assume.flash_attention) * act_bytes / 2
    logits = 6.0 * s * b * model_cfg.padded_vocab_size(t) / t  # bf16 logits + fp32 copy in the vocab-parallel loss
    last_act = (n_l * per_layer + logits) if p > 1 else 0.0
    activations = max(first_act + (logits if p == 1 else 0.0), last_act)

    bucket = deepspeed_bucket_bytes(psi, layout.zero_stage, n_dp, act_bytes, assume)
    gathered = 0.0
    if layout.zero_stage == 3:  # live gathered layer + the prefetched one
        split, rep = layer_parameters(model_cfg)
        gathered = 2 * 2 * (split / t + rep)
    buffers = assume.context_gib * GiB + bucket + gathered
    subtotal = sum(states.values()) + activations + buffers
    frag = assume.fragmentation * subtotal
    mem = {k: v / GiB for k, v in states.items()}
    mem.update(activations=activations / GiB, buffers=buffers / GiB, fragmentation=frag / GiB)
    mem["total"] = (subtotal + frag) / GiB
    fits = mem["total"] <= cluster.gpu_memory_gb

    # --- compute ---------------------------------------------------------------------------------------------------
    hw_flops_mb = hardware_flops_per_step(model_cfg, b, priced.recompute)
    stage_share = n_l / L  # the slowest stage sets the pace (uneven partitions cost here)
    eff = assume.kernel_efficiency
    d = h / t
    eff *= d / (d + assume.gemm_falloff)
    eff *= (b * s) / (b * s + assume.gemm_falloff)
    eff *= h / (h + assume.elementwise_hidden)
    peak = cluster.peak_tflops * 1e12
    t_mb = hw_flops_mb * stage_share / t / (peak * eff)

    # --- tensor-parallel communication (on the critical path; Megatron does not overlap it) --------------------------
    t_tp_mb = 0.0
    if t > 1:
        collectives = 4 + (2 if priced.recompute == "full" else 0)
        tp_spans = t > gpn
        bw = _group_bus_gbps(cluster, assume, min(t, gpn), tp_spans)
        lat = assume.latency_inter_s if tp_spans else assume.latency_intra_s
        t_tp_mb = n_l * collectives * ring_seconds(s * b * h * act_bytes, t, bw, "all_reduce", step_latency_s=lat)
        if tp_spans:
            notes.append("TP crosses nodes: its all-reduces run over InfiniBand")

    t_pipe = (m + p - 1) * (t_mb + t_tp_mb)
    t_compute = m * t_mb
    t_bubble = (p - 1) * (t_mb + t_tp_mb)

    # --- pipeline p2p: activations forward, gradients backward, per micro-batch, not overlapped --------------------
    t_pp = 0.0
    if p > 1:
        pp_spans = t * n_dp >= gpn  # neighbouring stages sit t*dp ranks apart
        # Across nodes every GPU sends its own p2p at the same time: each gets its share of the node's NICs.
        bw = _group_bus_gbps(cluster, assume, 1, pp_spans)
        msg = s * b * h * act_bytes / (t if layout.sequence_parallel else 1)
        lat = assume.latency_inter_s if pp_spans else assume.latency_intra_s
        t_pp = 2 * (m + p - 2) * (msg / (bw * 1e9) + lat)

    # --- data-parallel communication ---------------------------------------------------------------------------------
    t_dp = 0.0
    if n_dp > 1:
        dp_per_node = max(1, min(n_dp, gpn // t)) if t <= gpn else 1
        dp_spans = t * n_dp > gpn
        bw = _group_bus_gbps(cluster, assume, dp_per_node, dp_spans)
        grad_bytes = psi * act_bytes
        z = layout.zero_stage
        lat = assume.latency_inter_s if dp_spans else assume.latency_intra_s
        chunk = (assume.zero3_bucket_elements if z == 3 else assume.bucket_elements) * act_bytes

        def _ring(nbytes, n, bw_, kind):
            return ring_seconds(nbytes, n, bw_, kind, step_latency_s=lat, chunk_bytes=chunk)

        backward_mb = t_mb * 2 / 3
        if z == 0:  # one all-reduce after the last backward (the DeepSpeed engine does not overlap it)
            comm, window = _ring(grad_bytes, n_dp, bw, "all_reduce"), 0.0
        elif z == 1:  # reduce-scatter at the accumulation boundary + all-gather of updated params
            comm = _ring(grad_bytes, n_dp, bw, "all_reduce")
            window = 0.0
        elif z == 2:  # reduce-scatter every micro-batch (overlapped with its backward) + one all-gather
            rs = _ring(grad_bytes, n_dp, bw, "reduce_scatter")
            comm = m * rs + _ring(grad_bytes, n_dp, bw, "all_gather")
            window = m * min(rs, backward_mb * assume.overlap_efficiency) if assume.overlap_comm else 0.0
        else:  # ZeRO-3: all-gather params forward and backward + reduce-scatter grads, every micro-batch (1.5x)
            comm = m * (2 * _ring(grad_bytes, n_dp, bw, "all_gather") + _ring(grad_bytes, n_dp, bw, "reduce_scatter"))
            window = m * t_mb * assume.zero3_overlap
        t_dp = max(0.0, comm - window)

    step = t_pipe + t_pp + t_dp
    tokens_per_s = global_batch * s / step
    model_flops = model_flops_per_step(model_cfg, global_batch)
    hw_flops = hardware_flops_per_step(model_cfg, global_batch, priced.recompute)
    tflops = model_flops / step / world / 1e12
    days = gpu_hours = None
    if train_tokens:
        days = train_tokens / tokens_per_s / 86400
        gpu_hours = days * 24 * world
    return Estimate(
        layout=layout, fits=fits, memory_gib=mem, gpu_memory_gib=cluster.gpu_memory_gb, params_per_gpu=psi,
        micro_batches=m,
        time_s={"compute": t_compute, "tp_comm": m * t_tp_mb, "bubble": t_bubble, "pp_comm": t_pp, "dp_comm": t_dp,
                "step": step},
        bubble_fraction=(p - 1) / m, tokens_per_s=tokens_per_s, tflops_per_gpu=tflops,
        hardware_tflops_per_gpu=hw_flops / step / world / 1e12, mfu=tflops * 1e12 / peak, days=days,
        gpu_hours=gpu_hours, notes=notes)


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


def candidate_layouts(model_cfg, cluster, global_batch: int, assume: Assumptions = Assumptions()) -> list[Layout]:
    """Every layout worth pricing: TP within a node, any PP that divides the rest, ZeRO 0-3 (2/3 only without PP),
    power-of-two micro-batches, the recompute modes that differ (selective only without flash attention), SP
    whenever TP > 1 (same traffic, less memory)."""
    world = cluster.world_size
    out = []
    for t in _divisors(cluster.gpus_per_node):
        if world % t:
            continue
        for p in _divisors(world // t):
            if p > model_cfg.num_layers:
                break
            dp = world // (t * p)
            for z in ((0, 1, 2, 3) if p == 1 else (0, 1)):
                b = 1
                while b <= min(assume.max_micro_batch, global_batch // dp):
                    for r in ("none", "selective", "full"):
                        lay = Layout(tp=t, pp=p, dp=dp, zero_stage=z, micro_batch=b, sequence_parallel=t > 1,
                                     recompute=r)
                        if effective_layout(lay, assume) != lay:
                            continue  # runs as another candidate: listing it would show the same layout twice
                        if not layout_problems(model_cfg, cluster, lay, global_batch):
                            out.append(lay)
                    b *= 2
    return out


def _rank_key(e: Estimate):
    return (not e.fits, -e.tokens_per_s, e.memory_gib["total"])


def plan_layouts(model_cfg, cluster, global_batch: int, *, precision: str = "bf16", train_tokens: float | None = None,
                 assume: Assumptions = Assumptions()) -> list[Estimate]:
    """All candidate layouts priced and ranked: layouts that fit first, fastest first. A layout that differs from
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
    return (lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.sequence_parallel,
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
    msg = (f"the leanest layout searched ({smallest.layout.describe()}; ZeRO-3, full recompute and micro-batch 1 "
           f"were all tried) needs {smallest.memory_gib['total']:.1f} GiB per GPU "
           f"({format_memory(smallest.memory_gib)}) but each {cluster.gpu} has {cluster.gpu_memory_gb:g} GiB")
    nodes = cluster.nodes
    while nodes < max_nodes:
        nodes *= 2
        bigger = cluster.model_copy(update={"nodes": nodes})
        if any(e.fits for e in plan_layouts(model_cfg, bigger, global_batch, precision=precision, assume=assume)[:1]):
            msg += f"; with {nodes} nodes ({nodes * cluster.gpus_per_node} GPUs) a layout fits"
            break
    return msg


def format_memory(mem: dict[str, float]) -> str:
    keys = ("params", "grads", "optimizer", "activations", "buffers", "fragmentation")
    return ", ".join(f"{k} {mem[k]:.1f}" for k in keys) + f" = {mem['total']:.1f} GiB"

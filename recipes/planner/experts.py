"""What a mixture of experts adds to the cost model (recipes.planner.cost prices it with these): the experts' share of
a stage's parameters (split over EP and expert TP), the dispatch / combine all-to-all of the routed tokens per MoE
layer, and the load imbalance the step waits for.

How the layers run is recipes.model.moe and recipes.model.moe_dispatch: each rank routes its T / tp tokens (the MoE
layer is sequence-parallel inside TP), sends each token once per chosen expert to the EP rank holding that expert
(all-to-all over EP), all-gathers them over TP (experts are TP-split like the dense MLP: expert TP = TP), and returns
the outputs the same way (reduce-scatter over TP, all-to-all back). Backward runs the same four collectives on the
gradients. None of it is overlapped with compute here (megatron-core's overlap of the dispatch with the shared
expert is not built), so all of it is on the critical path.

Load imbalance is an assumption, not a measurement: `Assumptions.moe_load_imbalance` says how many times the mean
number of routed tokens the busiest EP rank receives. Training logs `moe_load_imbalance` in metrics.jsonl
(recipes.model.moe.routing_stats): the busiest EXPERT over the mean, worst layer, an upper bound for an EP rank, which
sums E / ep experts. Every rank waits for the busiest in the all-to-all and in the next collective, so its expert
GEMMs, its received bytes and its activations are priced at that factor. A capacity factor caps it (tokens over
capacity are dropped).
"""
from __future__ import annotations

from recipes.model.shape import layer_parameters, moe_layer_parameters


def stage_layers(model_cfg, pp: int) -> tuple[int, int]:
    """(layers, MoE layers) of the stage holding the most MoE layers under the uniform split (ceil(L / pp) layers a
    stage; a stage's memory and time are priced for its layers, the most loaded one sets the pace)."""
    L = model_cfg.num_layers
    per = -(-L // pp)
    if model_cfg.moe is None:  # dense: the search asks this for every candidate layout (~70,000 times a doc build)
        return per, 0
    key = (_pattern(model_cfg.moe), L, per)  # the search asks this tens of thousands of times for one model
    if key not in _MOST_MOE_LAYERS:
        if len(_MOST_MOE_LAYERS) > 1024:
            _MOST_MOE_LAYERS.clear()
        _MOST_MOE_LAYERS[key] = max(sum(model_cfg.is_moe_layer(i) for i in range(s, min(s + per, L)))
                                    for s in range(0, L, per))
    return per, _MOST_MOE_LAYERS[key]


_MOST_MOE_LAYERS: dict[tuple, int] = {}  # (which layers are MoE, layers, layers per stage) -> the most MoE layers


def _pattern(moe) -> tuple:
    """What `is_moe_layer` reads of model.moe, as a dictionary key."""
    pattern = moe.layer_pattern
    return (moe.first_dense_layers, pattern if isinstance(pattern, int) else tuple(pattern))


def stage_parameters(model_cfg, tp: int, pp: int, ep: int = 1) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one stage's decoder layers on one rank: attention, norms, dense MLPs, the
    router and shared experts split over TP as recipes.model.shape says; the routed experts over EP x TP."""
    per, n_moe = stage_layers(model_cfg, pp)
    split, replicated = layer_parameters(model_cfg)
    dense = (per - n_moe) * (split / tp + replicated)
    if not n_moe:
        return dense, 0.0
    moe_split, moe_replicated, experts = moe_layer_parameters(model_cfg)
    return dense + n_moe * (moe_split / tp + moe_replicated), n_moe * experts / (ep * tp)


def load_imbalance(model_cfg, ep: int, assume) -> float:
    """The factor the busiest EP rank's routed tokens exceed the mean by: 1 without EP (one rank holds every expert
    and runs all routed tokens, however they spread), else the assumption, capped by a capacity factor."""
    if model_cfg.moe is None or ep <= 1:
        return 1.0
    cap = model_cfg.moe.capacity_factor
    return min(assume.moe_load_imbalance, cap) if cap else assume.moe_load_imbalance


def routed_width(model_cfg, imbalance: float) -> float:
    """The MLP width one token's activations occupy in a MoE layer, as a dense MLP's ffn: top_k experts of
    moe.ffn_hidden_size (times the imbalance on the busiest rank), plus the shared expert."""
    moe = model_cfg.moe
    return moe.top_k * model_cfg.expert_ffn_size * imbalance + (moe.shared_expert_ffn_size or 0)


def all_to_all_seconds(nbytes: float, n: int, per_node: int, cluster, assume) -> float:
    """One all-to-all in which every rank of an n-rank group sends `nbytes` spread evenly over the n ranks (its own
    share stays): (per_node - 1) / n of it to the group's ranks in its node over NVLink at the NVLink bus bandwidth
    (nccl-tests: all-to-all bus bandwidth = algbw x (n-1)/n), (n - per_node) / n to other nodes over the node's NICs,
    which every GPU of the node shares (all of them are in an EP group, all sending at once). The two run together;
    the slower sets the time, plus one latency (the peer sends are issued together)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    nvlink = cluster.intra_node_gbps * assume.intra_link_efficiency * 1e9
    nic_share = cluster.inter_node_gbps * assume.inter_link_efficiency * 1e9 / cluster.gpus_per_node
    intra = nbytes * (per_node - 1) / n / nvlink
    inter = nbytes * (n - per_node) / n / nic_share
    return max(intra, inter) + (assume.latency_inter_s if per_node < n else assume.latency_intra_s)


def ep_members_per_node(layout, gpus_per_node: int) -> int:
    """EP ranks of one group in a node: EP is the fastest index of the data axis, so its ranks sit TP apart
    (recipes.parallel.layout); a group of ep x tp <= gpus_per_node ranks stays inside one node."""
    if layout.tp >= gpus_per_node:
        return 1
    return max(1, min(layout.ep, gpus_per_node // layout.tp))


def dispatch_bytes(model_cfg, layout, act_bytes: int, imbalance: float) -> float:
    """Bytes one rank sends in one all-to-all of a MoE layer (dispatch or combine, forward or backward): its
    s / cp / tp tokens of a micro-batch, each once per chosen expert, h values each; the busiest rank moves the
    imbalance times that."""
    tokens = model_cfg.seq_length // layout.cp * layout.micro_batch / layout.tp
    return tokens * model_cfg.moe.top_k * model_cfg.hidden_size * act_bytes * imbalance


def ep_seconds(model_cfg, cluster, layout, priced, act_bytes: int, assume, tp_link=None) -> float:
    """Expert-parallel traffic of one micro-batch on the slowest stage: per MoE layer and pass (forward, backward,
    and the recompute forward under full recompute) a dispatch and a combine all-to-all over EP; under expert TP the
    routed tokens' all-gather and reduce-scatter over TP beyond the one the dense MLP would have (tp_comm prices that
    one). `tp_link`: recipes.planner.cost's TP link (its `seconds(bytes, kind)`), needed when tp > 1."""
    if model_cfg.moe is None:
        return 0.0
    n_moe = stage_moe_layers(model_cfg, layout.pp)
    imb = load_imbalance(model_cfg, layout.ep, assume)
    passes = 3 if priced.recompute == "full" else 2
    nbytes = dispatch_bytes(model_cfg, layout, act_bytes, imb)
    a2a = 2 * all_to_all_seconds(nbytes, layout.ep, ep_members_per_node(layout, cluster.gpus_per_node), cluster,
                                 assume)
    tp_extra = 0.0
    if layout.tp > 1 and tp_link is not None:
        dense = model_cfg.seq_length // layout.cp * layout.micro_batch * model_cfg.hidden_size * act_bytes
        routed = dense * model_cfg.moe.top_k * imb
        tp_extra = max(0.0, sum(tp_link.seconds(routed, k) - tp_link.seconds(dense, k)
                                for k in ("all_gather", "reduce_scatter")))
    return n_moe * passes * (a2a + tp_extra)


def expert_flops_per_token(model_cfg) -> float:
    """Forward FLOPs of one token's routed experts in one MoE layer (top_k MLPs of moe.ffn_hidden_size)."""
    h, f = model_cfg.hidden_size, model_cfg.expert_ffn_size
    matrices = h * (2 * f if model_cfg.activation == "swiglu" else f) + f * h
    return 2.0 * model_cfg.moe.top_k * matrices


def expert_efficiency(model_cfg, layout, assume) -> float:
    """Achieved / peak FLOP/s of the expert GEMMs, by the rule of recipes.planner.cost.compute_efficiency with the
    expert's own sizes: its width per GPU (moe.ffn_hidden_size / TP: expert TP thins it) and the tokens one expert
    gets per micro-batch (s / cp x b x top_k x ep / num_experts: EP gathers more tokens per expert)."""
    moe = model_cfg.moe
    d = model_cfg.expert_ffn_size / layout.tp
    tokens = model_cfg.seq_length // layout.cp * layout.micro_batch * moe.top_k * layout.ep / moe.num_experts
    h = model_cfg.hidden_size
    return (assume.kernel_efficiency * d / (d + assume.gemm_falloff) * tokens / (tokens + assume.gemm_falloff)
            * h / (h + assume.elementwise_hidden))


def stage_moe_layers(model_cfg, pp: int) -> int:
    """MoE layers of the stage holding the most, with model.mtp's MoE depths on the last stage (which the partition
    gives no extra decoder layer: recipes.parallel.partition)."""
    most = stage_layers(model_cfg, pp)[1]
    if not model_cfg.mtp_is_moe:
        return most
    L = model_cfg.num_layers
    last = L // pp if pp > 1 else L
    return max(most, sum(model_cfg.is_moe_layer(i) for i in range(L - last, L)) + model_cfg.mtp_depths)


def expert_flops(model_cfg, layout, recompute: str) -> tuple[float, float]:
    """(the slowest stage's, the whole model's) routed-expert FLOPs of one micro-batch on one rank at the mean load,
    forward + backward (+ the recompute forward)."""
    passes = 4.0 if recompute == "full" else 3.0
    tokens = model_cfg.seq_length // layout.cp * layout.micro_batch
    per_layer = passes * tokens * expert_flops_per_token(model_cfg) / layout.tp
    total = stage_moe_layers(model_cfg, 1)  # one stage holding every layer: all the MoE layers (and MTP depths)
    return stage_moe_layers(model_cfg, layout.pp) * per_layer, total * per_layer


def imbalance_seconds(model_cfg, cluster, layout, priced, assume) -> float:
    """Seconds one micro-batch waits on the slowest stage for the busiest EP rank: its extra routed tokens (the
    imbalance - 1 times the mean) through the expert GEMMs, forward + backward (+ the recompute forward)."""
    imb = load_imbalance(model_cfg, layout.ep, assume)
    if imb <= 1.0:
        return 0.0
    stage, _ = expert_flops(model_cfg, layout, priced.recompute)
    return (imb - 1.0) * stage / (cluster.peak_tflops * 1e12 * expert_efficiency(model_cfg, layout, assume))


def expert_degrees(model_cfg, data_axis: int) -> list[int]:
    """EP degrees the search tries: 1 for a dense model; else every divisor of the data axis DP x CP that divides
    the experts (Layout.problems then says which of them run)."""
    if model_cfg.moe is None:
        return [1]
    return [e for e in range(1, data_axis + 1) if data_axis % e == 0 and model_cfg.moe.num_experts % e == 0]

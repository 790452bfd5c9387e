"""Shape arithmetic of the model our code builds: exact parameter counts (per TP rank and in total) and FLOPs per step.

Model knowledge, not cost modelling: the planner prices it, the pipeline partition weighs layers with it, the training
loop reports MFU with it. Sources: Narayanan et al. 2021 (Megatron-LM Eq. 2/3), Korthikanti et al. 2022.
"""
from __future__ import annotations


def norm_params(model_cfg) -> int:
    h = model_cfg.hidden_size
    return h if model_cfg.normalization == "rmsnorm" else 2 * h


def mla_matrices(model_cfg) -> tuple[int, int]:
    """Weights of an MLA attention's matrices (recipes.model.mla) as (split over TP: the up-projections and the
    output projection, held whole on every TP rank: the down-projections)."""
    mla, h, n = model_cfg.mla, model_cfg.hidden_size, model_cfg.num_attention_heads
    q_width = n * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    split = mla.kv_lora_rank * n * (mla.qk_nope_head_dim + mla.v_head_dim) + n * mla.v_head_dim * h
    replicated = h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
    if mla.q_lora_rank is None:
        split += h * q_width
    else:
        split += mla.q_lora_rank * q_width
        replicated += h * mla.q_lora_rank
    return split, replicated


def _mla_norms(model_cfg) -> int:
    """The latent norms of an MLA attention (q's only with a q_lora_rank), replicated."""
    mla, per = model_cfg.mla, norm_params(model_cfg) // model_cfg.hidden_size
    return per * (mla.kv_lora_rank + (mla.q_lora_rank or 0))


def _layer_matrices(model_cfg) -> tuple[int, int, int]:
    """(weights of the layer's matrices, qkv output width, fc1 output width)."""
    h, f = model_cfg.hidden_size, model_cfg.ffn_size
    head_dim = model_cfg.kv_channels
    q_out = model_cfg.num_attention_heads * head_dim  # = h unless model.head_dim says otherwise
    qkv_out = q_out + 2 * model_cfg.query_groups * head_dim
    fc1_out = 2 * f if model_cfg.activation == "swiglu" else f
    attention = h * qkv_out + q_out * h if model_cfg.mla is None else sum(mla_matrices(model_cfg))
    return attention + h * fc1_out + f * h, qkv_out, fc1_out


def layer_parameters(model_cfg) -> tuple[int, int]:
    """Parameters of one decoder layer as (split across TP ranks, replicated on every TP rank).

    Column-parallel weights and biases (qkv, fc1) and row-parallel weights (proj, fc2) are split; norms and the
    row-parallel biases are replicated (Megatron adds the row-parallel bias after the all-reduce).
    """
    h = model_cfg.hidden_size
    split, qkv_out, fc1_out = _layer_matrices(model_cfg)
    replicated = 2 * norm_params(model_cfg)
    if model_cfg.mla is not None:  # its down-projections and latent norms are held whole by every TP rank
        mla_replicated = mla_matrices(model_cfg)[1]
        split -= mla_replicated
        replicated += mla_replicated + _mla_norms(model_cfg)
    if model_cfg.qk_norm:  # one norm of head_dim for the queries, one for the keys
        replicated += 2 * norm_params(model_cfg) // h * model_cfg.kv_channels
    if model_cfg.qkv_bias:  # add_bias_linear or add_qkv_bias (Qwen2)
        split += qkv_out
    if model_cfg.add_bias_linear:
        split += fc1_out
        replicated += 2 * h
    return split, replicated


def _mlp_matrices(model_cfg, ffn: int) -> int:
    """Weights of one (dense, expert or shared) MLP of width `ffn`."""
    h = model_cfg.hidden_size
    return h * (2 * ffn if model_cfg.activation == "swiglu" else ffn) + ffn * h


def moe_layer_parameters(model_cfg) -> tuple[int, int, int]:
    """Parameters of one MoE decoder layer as (split across TP ranks, replicated on every TP rank, routed experts).

    The routed experts (num_experts MLPs of model.moe.ffn_hidden_size) are split over TP and over EP ranks; attention
    and the shared expert are split over TP; norms, the router [E, h] and the shared-expert gate [1, h] are replicated.
    """
    moe, h = model_cfg.moe, model_cfg.hidden_size
    dense_split, replicated = layer_parameters(model_cfg)
    split = dense_split - _mlp_matrices(model_cfg, model_cfg.ffn_size)  # attention only
    replicated += moe.num_experts * h
    if moe.shared_expert_ffn_size:
        split += _mlp_matrices(model_cfg, moe.shared_expert_ffn_size)
        replicated += h if moe.shared_expert_gate else 0
    return split, replicated, moe.num_experts * _mlp_matrices(model_cfg, model_cfg.expert_ffn_size)


def decoder_parameters(model_cfg, active: bool = False) -> int:
    """All decoder layers' parameters; `active`: only the top_k routed experts of each MoE layer count (what one
    token's forward pass uses, as MoE models are reported: Mixtral-8x7B 46.7B total, 12.9B active)."""
    return sum(_one_layer(model_cfg, model_cfg.is_moe_layer(i), active) for i in range(model_cfg.num_layers))


def _one_layer(model_cfg, moe: bool, active: bool) -> int:
    split, replicated = layer_parameters(model_cfg)
    if not moe:
        return split + replicated
    s, r, experts = moe_layer_parameters(model_cfg)
    if active:
        experts = experts // model_cfg.moe.num_experts * model_cfg.moe.top_k
    return s + r + experts


def mtp_parameters(model_cfg, active: bool = False) -> int:
    """model.mtp's prediction depths (recipes.model.mtp): each a decoder layer (MoE when the last layer is) plus
    eh_proj [h, 2h] and three norms (enorm, hnorm, final_layernorm); the embedding and head are the model's."""
    h = model_cfg.hidden_size
    per_depth = _one_layer(model_cfg, model_cfg.mtp_is_moe, active) + 2 * h * h + 3 * norm_params(model_cfg)
    return model_cfg.mtp_depths * per_depth


def count_parameters(model_cfg, tp: int = 1, active: bool = False) -> int:
    """Exact parameter count of the model our code builds (vocabulary padded for `tp`), all ranks together, once;
    `active`: counting only the top_k routed experts of each MoE layer (= count_parameters for a dense model)."""
    h = model_cfg.hidden_size
    v = model_cfg.padded_vocab_size(tp)
    total = v * h + decoder_parameters(model_cfg, active) + norm_params(model_cfg) + mtp_parameters(model_cfg, active)
    if model_cfg.position_embedding == "learned":
        total += model_cfg.seq_length * h
    if not model_cfg.tied_embeddings:
        total += v * h
    return total


def attention_score_flops(model_cfg) -> float:
    """QK^T and scores x V of one token against all s keys in one layer (the whole block): 2 s (query/key width +
    value width) summed over the heads: 4 s h for multi-head attention, 2 s n (dn + dr + dv) for MLA."""
    s, mla = model_cfg.seq_length, model_cfg.mla
    if mla is None:
        return 4.0 * s * model_cfg.hidden_size
    return 2.0 * s * model_cfg.num_attention_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim)


def _forward_flops_per_token(model_cfg, causal: bool = False) -> tuple[float, float, float]:
    """(layer matmul FLOPs, attention-score FLOPs, output-layer FLOPs) of one token's forward pass.

    Matmuls: 2 FLOPs per weight of every layer matrix and of the output layer. Attention: QK^T and scores x V are
    2*s*h each per token per layer, growing with s^2 per sequence (`attention_score_flops`). `causal=False` counts the
    whole s x s block (what a kernel that computes the scores and then masks them executes); `causal=True` the lower
    triangle only (what a causal model needs, and what flash kernels execute: they skip the masked blocks): half.
    model.mtp's D depths are D more layers (of the last layer's kind), their eh_proj and D more output layers.
    """
    matrices, _, _ = _layer_matrices(model_cfg)  # biases are additions, not multiply-adds
    h, L, D = model_cfg.hidden_size, model_cfg.num_layers, model_cfg.mtp_depths
    head = 2.0 * model_cfg.padded_vocab_size(1) * h * (1 + D)
    attn = (L + D) * attention_score_flops(model_cfg) * (0.5 if causal else 1.0)
    depths = 2.0 * D * 2 * h * h  # eh_proj
    if model_cfg.moe is not None:  # active weights: router, top_k routed experts, the shared expert
        moe = model_cfg.moe
        moe_layer = (matrices - _mlp_matrices(model_cfg, model_cfg.ffn_size) + moe.num_experts * h
                     + moe.top_k * _mlp_matrices(model_cfg, model_cfg.expert_ffn_size)
                     + (_mlp_matrices(model_cfg, moe.shared_expert_ffn_size) if moe.shared_expert_ffn_size else 0))
        n_moe = sum(model_cfg.is_moe_layer(i) for i in range(L)) + (D if model_cfg.mtp_is_moe else 0)
        return 2.0 * ((L + D - n_moe) * matrices + n_moe * moe_layer) + depths, attn, head
    return 2.0 * (L + D) * matrices + depths, attn, head


def attention_flops_per_step(model_cfg, global_batch: int, recompute: str = "none", causal: bool = False) -> float:
    """The attention-score part of `hardware_flops_per_step` (QK^T and scores x V, forward + backward, and again in a
    recompute forward): the part an attention kernel runs rather than a GEMM."""
    _, attn, _ = _forward_flops_per_token(model_cfg, causal)
    return (4.0 if recompute in ("full", "selective") else 3.0) * attn * global_batch * model_cfg.seq_length


def model_flops_per_step(model_cfg, global_batch: int, causal: bool = True) -> float:
    """Model FLOPs of one optimizer step (forward + backward = 3x forward, no recompute): the numerator of MFU. For
    MoE layers the active weights count (router, top_k experts, shared expert), as MoE MFU is reported.

    Causal attention counts the lower triangle of the s x s block only, the work a causal model needs (Megatron-LM's
    current `num_floating_point_operations`: "only half of the attention matrix is non-zero"; Meta's lingua counts the
    same). `causal=False` counts the whole block, the 2021-2022 convention: for a GPT shape (gelu, f = 4h, MHA) it
    equals Korthikanti's 72 B L s h^2 (1 + s/(6h) + V/(12 h L)), PaLM's 6N + 12 L h s per token. The two differ little
    at 2-8K tokens and by up to 2x at 128K, where attention is most of a small model's work.
    """
    mm, attn, head = _forward_flops_per_token(model_cfg, causal)
    return 3.0 * (mm + attn + head) * global_batch * model_cfg.seq_length


def hardware_flops_per_step(model_cfg, global_batch: int, recompute: str = "none", causal: bool = False) -> float:
    """FLOPs the GPUs actually execute: full recompute repeats every layer's forward (Eq. 3: 4x forward for the
    layers, 3x for the output layer, which is not recomputed), selective recompute only the attention scores;
    `causal=True` when the attention kernel skips the masked upper triangle (flash / SDPA lower-right causal)."""
    mm, attn, head = _forward_flops_per_token(model_cfg, causal)
    tokens = global_batch * model_cfg.seq_length
    if recompute == "full":
        return (4.0 * (mm + attn) + 3.0 * head) * tokens
    if recompute == "selective":
        return (3.0 * (mm + attn + head) + attn) * tokens
    return 3.0 * (mm + attn + head) * tokens

"""Mixture-of-experts families in transformers: which one a recipe's model is, its config, and the recipe fields of
an imported one. The tensors map through recipes.hf.convert's declarative maps (MOE_MLP_MAP for the MoE layers).

  family     | transformers class    | what makes it that family here
  -----------|-----------------------|----------------------------------------------------------------------------
  mixtral    | MixtralForCausalLM    | every layer MoE, top-k renormalized, no shared expert, no qk norm, no biases
  qwen2_moe  | Qwen2MoeForCausalLM   | a shared expert with its sigmoid gate; q/k/v biases or not; dense layers via
             |                       | mlp_only_layers; top-k renormalized or not (norm_topk_prob)
  qwen3_moe  | Qwen3MoeForCausalLM   | qk norm (model.qk_norm), head_dim, no shared expert, no biases; dense layers
             |                       | via mlp_only_layers

Training-only options do not travel: a capacity factor (transformers' blocks are dropless; an exported model routes
every token) and the aux / z-loss coefficients (router_aux_loss_coef carries the aux one, for fine-tuning with HF).
"""
from __future__ import annotations

from recipes.hf.convert import UnsupportedModel, _dims, _max_positions, _rope_parameters

ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM"}


def moe_family(m) -> str:
    """The transformers MoE family of a rope + rmsnorm + swiglu model with model.moe (or model.qk_norm), or
    UnsupportedModel saying which option has no counterpart."""
    if m.moe is None:
        raise UnsupportedModel("model.qk_norm=true without model.moe: export supports qk norm in Qwen3-MoE only; "
                               "set model.qk_norm=false or add model.moe")
    moe, L = m.moe, m.num_layers
    shared = moe.shared_expert_ffn_size is not None
    problems = []
    if m.add_bias_linear:
        problems.append("model.add_bias_linear=true (no MoE family has MLP biases)")
    if m.qk_norm:
        fam = "qwen3_moe"
        if shared:
            problems.append("a shared expert with model.qk_norm (Qwen3-MoE has none; Qwen2-MoE has no qk norm)")
        if m.add_qkv_bias:
            problems.append("model.add_qkv_bias=true with model.qk_norm (Qwen3-MoE's attention_bias is on q, k, v "
                            "and the output projection)")
    elif shared:
        fam = "qwen2_moe"
        if not moe.shared_expert_gate:
            problems.append("a shared expert without model.moe.shared_expert_gate (Qwen2-MoE always gates it)")
    else:
        fam = "mixtral"
        if not all(m.is_moe_layer(i) for i in range(L)):
            problems.append(f"dense layers (model.moe.layer_pattern={moe.layer_pattern}, first_dense_layers="
                            f"{moe.first_dense_layers}): Mixtral has experts in every layer (Qwen2/3-MoE have "
                            "mlp_only_layers: add model.qk_norm for Qwen3-MoE)")
        if not moe.normalize_top_k:
            problems.append("model.moe.normalize_top_k=false (Mixtral renormalizes the top-k probabilities)")
        if m.add_qkv_bias:
            problems.append("model.add_qkv_bias=true (Mixtral has no biases)")
    if problems:
        raise UnsupportedModel(f"model.moe: no transformers class for this model ({fam} is nearest): "
                               + "; ".join(problems))
    return fam


def moe_config(m, tokenizer_ids: dict | None = None):
    """The transformers config of a MoE model (family by `moe_family`)."""
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    fam, moe, ids = moe_family(m), m.moe, tokenizer_ids or {}
    a, g, d, h = _dims(m)
    common = dict(
        vocab_size=m.vocab_size, hidden_size=h, num_hidden_layers=m.num_layers, num_attention_heads=a,
        num_key_value_heads=g, head_dim=d, hidden_act="silu", max_position_embeddings=_max_positions(m),
        rms_norm_eps=m.norm_epsilon, tie_word_embeddings=m.tied_embeddings, rope_parameters=_rope_parameters(m),
        initializer_range=m.init_method_std, bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"),
        pad_token_id=ids.get("pad"), dtype="float32", num_experts_per_tok=moe.top_k,
        router_aux_loss_coef=moe.aux_loss_coeff, architectures=[ARCHITECTURES[fam]])
    if fam == "mixtral":
        return MixtralConfig(**common, intermediate_size=m.expert_ffn_size, num_local_experts=moe.num_experts,
                             sliding_window=None)
    qwen = dict(intermediate_size=m.ffn_size, moe_intermediate_size=m.expert_ffn_size, num_experts=moe.num_experts,
                norm_topk_prob=moe.normalize_top_k, decoder_sparse_step=1, use_sliding_window=False,
                mlp_only_layers=[i for i in range(m.num_layers) if not m.is_moe_layer(i)])
    if fam == "qwen2_moe":
        return Qwen2MoeConfig(**common, **qwen, shared_expert_intermediate_size=moe.shared_expert_ffn_size,
                              qkv_bias=m.add_qkv_bias)
    return Qwen3MoeConfig(**common, **qwen, attention_bias=False)


def _layer_pattern(cfg) -> list[int]:
    """Which layers of a Qwen2/3-MoE config are sparse: not in mlp_only_layers and (i + 1) % decoder_sparse_step."""
    step, dense = max(1, getattr(cfg, "decoder_sparse_step", 1) or 1), set(getattr(cfg, "mlp_only_layers", []) or [])
    return [int(i not in dense and (i + 1) % step == 0) for i in range(cfg.num_hidden_layers)]


def moe_model_fields(cfg, rope_fields) -> dict:
    """Recipe `model.*` fields (with a full `moe` section) of a Mixtral / Qwen2-MoE / Qwen3-MoE config; refuses what
    our model cannot represent exactly."""
    problems: list[str] = []
    t = cfg.model_type
    rope = rope_fields(cfg, problems)
    if cfg.hidden_act != "silu":
        problems.append(f"hidden_act={cfg.hidden_act} (SwiGLU needs silu)")
    if t == "qwen3_moe" and getattr(cfg, "attention_bias", False):
        problems.append("attention_bias=true (biases on q, k, v and the output projection; ours: q, k, v only)")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if t == "mixtral":
        experts, expert_ffn, dense_ffn, pattern = cfg.num_local_experts, cfg.intermediate_size, None, 1
        normalize, shared = True, None
    else:
        experts, expert_ffn, dense_ffn = cfg.num_experts, cfg.moe_intermediate_size, cfg.intermediate_size
        pattern, normalize = _layer_pattern(cfg), bool(cfg.norm_topk_prob)
        shared = getattr(cfg, "shared_expert_intermediate_size", None) if t == "qwen2_moe" else None
        if t == "qwen2_moe" and not shared:
            problems.append("shared_expert_intermediate_size=0 (Qwen2-MoE's shared expert and gate always exist)")
        if not any(pattern):
            problems.append("no sparse layer (decoder_sparse_step / mlp_only_layers): import it as a dense model")
    if problems:
        raise UnsupportedModel(f"cannot import this transformers model ({t}): " + "; ".join(problems))
    moe = {"num_experts": experts, "top_k": cfg.num_experts_per_tok, "ffn_hidden_size": expert_ffn,
           "shared_expert_ffn_size": shared or None, "shared_expert_gate": bool(shared), "normalize_top_k": normalize,
           "aux_loss_coeff": float(getattr(cfg, "router_aux_loss_coef", 0.0) or 0.0), "layer_pattern": pattern,
           "first_dense_layers": 0, "capacity_factor": None}
    return {
        "num_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_query_groups": cfg.num_key_value_heads or cfg.num_attention_heads,
        "head_dim": None if head_dim * cfg.num_attention_heads == cfg.hidden_size else head_dim,
        "ffn_hidden_size": dense_ffn or expert_ffn, "vocab_size": cfg.vocab_size,
        "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu", **rope,
        "norm_epsilon": cfg.rms_norm_eps, "tied_embeddings": bool(cfg.tie_word_embeddings),
        "add_bias_linear": False, "add_qkv_bias": bool(t == "qwen2_moe" and getattr(cfg, "qkv_bias", True)),
        "qk_norm": t == "qwen3_moe", "moe": moe,
    }

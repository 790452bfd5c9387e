"""Canonical full state (see `recipes.checkpoint.format.shards`) <-> Hugging Face transformers state dicts and configs.

Families:
  * rope + rmsnorm + swiglu            -> `LlamaForCausalLM` (GQA as num_key_value_heads, biases as attention_bias /
                                          mlp_bias, tied or untied head, rope_scaling as rope_type llama3)
    ... with add_qkv_bias only         -> `Qwen2ForCausalLM` (biases on q, k, v; no sliding window)
  * learned + layernorm + gelu         -> `GPT2LMHeadModel` (activation gelu_pytorch_tanh = our tanh GeLU exactly;
                                          zero biases when the recipe has none; GQA key/value heads repeated)
  * rope + rmsnorm + swiglu + model.moe -> `MixtralForCausalLM`, `Qwen2MoeForCausalLM` or `Qwen3MoeForCausalLM`
                                          (recipes.hf.moe_families: which one, their configs, import)
  * model.mla (+ DeepSeek routing, model.mtp) -> `DeepseekV3ForCausalLM` (recipes.hf.deepseek)
  * anything else                      -> `UnsupportedModel` naming the option.
Import reads Llama (1/2/3.x), Qwen2, Mistral, Mixtral, Qwen2-MoE and Qwen3-MoE configs; a sliding window only when it
is >= model.seq_length (then a no-op), see `check_sliding_window`.

Our layer numbering (pipeline index): 0 embedding, 1..L decoder layers (HF layer i-1), L+1 final norm, L+2 head.
"""
from __future__ import annotations

from collections import OrderedDict

import torch


class UnsupportedModel(ValueError):
    """The recipe's (or the HF model's) architecture has no exact counterpart on the other side."""


def family(model_cfg) -> str:
    m = model_cfg
    if m.mla is not None:  # multi-head latent attention: DeepSeek-V3 (recipes.hf.deepseek)
        from recipes.hf.deepseek import check

        return check(m)
    if (m.position_embedding, m.normalization, m.activation) == ("rope", "rmsnorm", "swiglu"):
        if m.moe is not None or m.qk_norm:
            from recipes.hf.moe_families import moe_family

            return moe_family(m)
        return "qwen2" if m.add_qkv_bias and not m.add_bias_linear else "llama"
    if (m.position_embedding, m.normalization, m.activation) == ("learned", "layernorm", "gelu"):
        return "gpt2"
    raise UnsupportedModel(
        f"model.position_embedding={m.position_embedding}, model.normalization={m.normalization}, "
        f"model.activation={m.activation}: export supports rope+rmsnorm+swiglu (Llama; Qwen2 with add_qkv_bias) or "
        "learned+layernorm+gelu (GPT-2) only")


def _dims(m):
    a, g, h = m.num_attention_heads, m.query_groups, m.hidden_size
    return a, g, m.kv_channels, h


def _split_qkv(qkv: torch.Tensor, m):
    """megatron-core [g x (a/g q heads, 1 k, 1 v) x d, ...] -> q [a d, ...], k [g d, ...], v [g d, ...]."""
    a, g, d, _ = _dims(m)
    per = a // g
    x = qkv.reshape(g, (per + 2) * d, *qkv.shape[1:])
    q = x[:, : per * d].reshape(a * d, *qkv.shape[1:])
    k = x[:, per * d: (per + 1) * d].reshape(g * d, *qkv.shape[1:])
    v = x[:, (per + 1) * d:].reshape(g * d, *qkv.shape[1:])
    return q, k, v


def _join_qkv(q, k, v, m):
    a, g, d, _ = _dims(m)
    per = a // g
    rest = q.shape[1:]
    x = torch.cat([q.reshape(g, per * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
    return x.reshape((a + 2 * g) * d, *rest)


# ------------------------------------------------------------------------------------- Llama-style families
# Llama, Qwen2 and Mistral share transformers' tensor names and differ only in which biases exist, so one declarative
# map serves all three (torchtitan's state_dict_adapter idea). One row per tensor of decoder layer i (ours: "i.",
# HF: "model.layers.{i-1}."): (our name, HF names, how, when)
#   how:  "copy" one tensor | "qkv" megatron-core's grouped qkv <-> q_proj, k_proj, v_proj | "cat" [gate; up]
#   when: None always | "qkv_bias" model.qkv_bias (add_bias_linear or add_qkv_bias) | "bias" model.add_bias_linear
#         "qk_norm" model.qk_norm | "shared" / "shared_gate" model.moe's shared expert / its gate
LLAMA_ATTENTION_MAP = (
    ("input_layernorm.weight", ("input_layernorm.weight",), "copy", None),
    ("self_attention.linear_qkv.weight",
     ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), "qkv", None),
    ("self_attention.linear_qkv.bias",
     ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"), "qkv", "qkv_bias"),
    ("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), "copy", "qk_norm"),
    ("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), "copy", "qk_norm"),
    ("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), "copy", None),
    ("self_attention.linear_proj.bias", ("self_attn.o_proj.bias",), "copy", "bias"),
    ("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "copy", None),
)
LLAMA_MLP_MAP = (
    ("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "cat", None),
    ("mlp.linear_fc1.bias", ("mlp.gate_proj.bias", "mlp.up_proj.bias"), "cat", "bias"),
    ("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "copy", None),
    ("mlp.linear_fc2.bias", ("mlp.down_proj.bias",), "copy", "bias"),
)
LLAMA_LAYER_MAP = LLAMA_ATTENTION_MAP + LLAMA_MLP_MAP
# The MLP of an MoE layer (model.moe; Mixtral / Qwen2-MoE / Qwen3-MoE, transformers >= 5 names): experts stacked
# [E, 2f, h] with [gate; up] rows, as ours (recipes.model.moe)
MOE_MLP_MAP = (
    ("mlp.router.weight", ("mlp.gate.weight",), "copy", None),
    ("mlp.experts.linear_fc1.weight", ("mlp.experts.gate_up_proj",), "copy", None),
    ("mlp.experts.linear_fc2.weight", ("mlp.experts.down_proj",), "copy", None),
    ("mlp.shared_experts.linear_fc1.weight",
     ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"), "cat", "shared"),
    ("mlp.shared_experts.linear_fc2.weight", ("mlp.shared_expert.down_proj.weight",), "copy", "shared"),
    ("mlp.shared_experts.gate_weight", ("mlp.shared_expert_gate.weight",), "copy", "shared_gate"),
)
# Outside the decoder layers ({norm} = L + 1, {head} = L + 2); "untied": only without tied embeddings.
LLAMA_OUTER_MAP = (
    ("0.word_embeddings.weight", "model.embed_tokens.weight", None),
    ("{norm}.norm.weight", "model.norm.weight", None),
    ("{head}.output_layer.weight", "lm_head.weight", "untied"),
)

# Which transformers class a rope + rmsnorm + swiglu recipe exports to: Qwen2 is Llama with a bias on q, k, v only.
LLAMA_STYLE_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _present(when, m) -> bool:
    shared = m.moe is not None and m.moe.shared_expert_ffn_size is not None
    return {None: True, "qkv_bias": m.qkv_bias, "bias": m.add_bias_linear, "untied": not m.tied_embeddings,
            "qk_norm": m.qk_norm, "shared": shared, "shared_gate": shared and m.moe.shared_expert_gate}[when]


def _outer(m):
    L = m.num_layers
    for ours, hf, when in LLAMA_OUTER_MAP:
        if _present(when, m):
            yield ours.format(norm=L + 1, head=L + 2), hf


def _layer_rows(m):
    for i in range(1, m.num_layers + 1):
        for ours, hf, how, when in LLAMA_ATTENTION_MAP + (MOE_MLP_MAP if m.is_moe_layer(i - 1) else LLAMA_MLP_MAP):
            if _present(when, m):
                yield f"{i}.{ours}", tuple(f"model.layers.{i - 1}.{n}" for n in hf), how


def to_llama(w: dict, m) -> OrderedDict:
    """Canonical names -> Llama / Qwen2 / Mistral HF names (the map above)."""
    out = OrderedDict()
    for ours, hf in _outer(m):
        out[hf] = w[ours]
    for ours, hf_names, how in _layer_rows(m):
        t = w[ours]
        parts = _split_qkv(t, m) if how == "qkv" else t.chunk(2, dim=0) if how == "cat" else (t,)
        out.update(zip(hf_names, parts))
    return OrderedDict((k, v.contiguous().clone()) for k, v in out.items())


def from_llama(hf: dict, m) -> OrderedDict:
    """Inverse of `to_llama` (HF names -> canonical names)."""
    def take(name):
        if name not in hf:
            raise UnsupportedModel(f"the transformers checkpoint has no tensor '{name}' (not a Llama-style model, "
                                   "or config.json does not match the weights?)")
        return hf[name]

    w = OrderedDict()
    for ours, name in _outer(m):
        w[ours] = take(name)
    for ours, hf_names, how in _layer_rows(m):
        parts = [take(n) for n in hf_names]
        w[ours] = _join_qkv(*parts, m) if how == "qkv" else torch.cat(parts, dim=0) if how == "cat" else parts[0]
    return OrderedDict((k, v.float().contiguous().clone()) for k, v in w.items())


def _rope_parameters(m) -> dict:
    rope = {"rope_type": "default", "rope_theta": float(m.rotary_base)}
    r = m.rope_scaling
    if r is not None and r.type == "yarn":  # DeepSeek-V3 (model.mla)
        rope.update(rope_type="yarn", factor=float(r.factor), beta_fast=float(r.beta_fast),
                    beta_slow=float(r.beta_slow), original_max_position_embeddings=r.original_max_position_embeddings,
                    **{k: float(getattr(r, k)) for k in ("mscale", "mscale_all_dim") if getattr(r, k)})
    elif r is not None:
        rope.update(rope_type=r.type, factor=float(r.factor), low_freq_factor=float(r.low_freq_factor),
                    high_freq_factor=float(r.high_freq_factor),
                    original_max_position_embeddings=r.original_max_position_embeddings)
    return rope


def _max_positions(m) -> int:
    """max_position_embeddings of an export: the training length, or with llama3 scaling at least the context the
    scaling was made for (transformers warns when original_max_position_embeddings >= max_position_embeddings)."""
    if m.rope_scaling is None:
        return m.seq_length
    return max(m.seq_length, int(m.rope_scaling.original_max_position_embeddings * m.rope_scaling.factor))


def llama_style_config(m, tokenizer_ids: dict | None = None):
    """LlamaConfig, or Qwen2Config when the recipe has a qkv-only bias (add_qkv_bias without add_bias_linear)."""
    from transformers import LlamaConfig, Qwen2Config

    ids = tokenizer_ids or {}
    a, g, d, h = _dims(m)
    common = dict(
        vocab_size=m.vocab_size, hidden_size=h, intermediate_size=m.ffn_size, num_hidden_layers=m.num_layers,
        num_attention_heads=a, num_key_value_heads=g, hidden_act="silu", max_position_embeddings=_max_positions(m),
        rms_norm_eps=m.norm_epsilon, tie_word_embeddings=m.tied_embeddings, rope_parameters=_rope_parameters(m),
        initializer_range=m.init_method_std, bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"),
        pad_token_id=ids.get("pad"), dtype="float32")
    if family(m) == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False, architectures=["Qwen2ForCausalLM"])
    return LlamaConfig(**common, head_dim=d, attention_bias=m.add_bias_linear, mlp_bias=m.add_bias_linear,
                       architectures=["LlamaForCausalLM"])


# Mistral and Qwen2 are Llama-shaped; what they add is a bias on q/k/v (Qwen2) and sliding-window attention (both;
# ours is full causal, see `check_sliding_window`).
IMPORTABLE = ("llama", "qwen2", "mistral")


def _rope_fields(cfg, problems: list) -> dict:
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"rope_parameters.partial_rotary_factor={rope['partial_rotary_factor']} (RoPE on the whole "
                        "head only)")
    if rope_type == "default":
        return {"rotary_base": theta, "rope_scaling": None}
    if rope_type == "llama3":
        return {"rotary_base": theta, "rope_scaling": {
            "type": "llama3", "factor": float(rope["factor"]), "low_freq_factor": float(rope["low_freq_factor"]),
            "high_freq_factor": float(rope["high_freq_factor"]),
            "original_max_position_embeddings": int(rope["original_max_position_embeddings"])}}
    problems.append(f"rope_parameters.rope_type={rope_type} (supported: default, llama3 -> model.rope_scaling)")
    return {}


def sliding_window(cfg) -> int | None:
    """The attention window of a Mistral / Qwen2 config, None when every layer attends to the whole sequence."""
    window = getattr(cfg, "sliding_window", None)
    if cfg.model_type in ("qwen2_moe", "qwen3_moe") and not getattr(cfg, "use_sliding_window", False):
        return None
    if cfg.model_type == "qwen2":  # Qwen2 slides only with use_sliding_window, and only in layers >= max_window_layers
        if not getattr(cfg, "use_sliding_window", False):
            return None
        if "sliding_attention" not in (getattr(cfg, "layer_types", None) or []):
            return None
    return window


def check_sliding_window(cfg, seq_length: int) -> None:
    """Our attention is plain causal: a window of W tokens (query i sees keys i-W+1 .. i) changes nothing only when
    no sequence is longer than W, so an import with model.seq_length <= W is exact and anything else is refused."""
    window = sliding_window(cfg)
    if window is not None and window < seq_length:
        raise UnsupportedModel(
            f"config.json has sliding_window={window} ({cfg.model_type}), but model.seq_length={seq_length}: this "
            "recipe's attention is full causal and cannot express a sliding window. Set model.seq_length="
            f"{window} (or less; the window then never cuts attention and the import is exact), or import a "
            "checkpoint without a window (e.g. Mistral v0.2+ has sliding_window null)")


def model_fields_from_hf_config(cfg, hf_dir: str | None = None) -> dict:
    """Recipe `model.*` fields of a transformers Llama / Qwen2 / Mistral config (MoE and DeepSeek-V3 configs: their
    modules; `hf_dir`: where DeepSeek-V3's MTP depths are looked for); refuses what our model cannot represent
    exactly (the sliding window is checked against the recipe's seq_length by `check_sliding_window`)."""
    problems = []
    model_type = getattr(cfg, "model_type", "llama")
    if model_type == "deepseek_v3":
        from recipes.hf.deepseek import model_fields, mtp_depths_in

        return model_fields(cfg, _rope_fields, mtp_depths_in(hf_dir, cfg) if hf_dir else 0)
    if model_type in ("mixtral", "qwen2_moe", "qwen3_moe"):
        from recipes.hf.moe_families import moe_model_fields

        return moe_model_fields(cfg, _rope_fields)
    if model_type not in IMPORTABLE:
        problems.append(f"model_type={model_type} (supported: {', '.join(IMPORTABLE)})")
    rope = _rope_fields(cfg, problems)
    if cfg.hidden_act != "silu":
        problems.append(f"hidden_act={cfg.hidden_act} (SwiGLU needs silu)")
    add_bias_linear = add_qkv_bias = False
    if model_type == "qwen2":
        add_qkv_bias = True  # transformers' Qwen2 always has q/k/v biases and no others
    elif model_type == "llama":
        if getattr(cfg, "attention_bias", False) != getattr(cfg, "mlp_bias", False):
            problems.append("attention_bias != mlp_bias (our model.add_bias_linear covers both)")
        add_bias_linear = bool(getattr(cfg, "attention_bias", False))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim * cfg.num_attention_heads != cfg.hidden_size:
        problems.append(f"head_dim={head_dim} x heads != hidden_size={cfg.hidden_size}")
    if problems:
        raise UnsupportedModel("cannot import this transformers model: " + "; ".join(problems))
    return {
        "num_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_query_groups": cfg.num_key_value_heads or cfg.num_attention_heads,
        "ffn_hidden_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
        "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu", **rope,
        "norm_epsilon": cfg.rms_norm_eps, "tied_embeddings": bool(cfg.tie_word_embeddings),
        "add_bias_linear": add_bias_linear, "add_qkv_bias": add_qkv_bias,
        "head_dim": None, "qk_norm": False, "moe": None,  # (replacing whatever the --config recipe had)
    }


# ------------------------------------------------------------------------------------------------------- GPT-2
def gpt2_config(m, tokenizer_ids: dict | None = None):
    from transformers import GPT2Config

    ids = tokenizer_ids or {}
    return GPT2Config(
        vocab_size=m.vocab_size, n_positions=m.seq_length, n_embd=m.hidden_size, n_layer=m.num_layers,
        n_head=m.num_attention_heads, n_inner=m.ffn_size, activation_function="gelu_pytorch_tanh",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=m.norm_epsilon,
        initializer_range=m.init_method_std, scale_attn_weights=True, tie_word_embeddings=m.tied_embeddings,
        bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"), pad_token_id=ids.get("pad"), dtype="float32",
        architectures=["GPT2LMHeadModel"])


def to_gpt2(w: dict, m) -> OrderedDict:
    """GPT-2 keeps Conv1D weights as [in, out] (transposed) and has biases everywhere."""
    L, h, f = m.num_layers, m.hidden_size, m.ffn_size
    a, g, d, _ = _dims(m)

    def bias(name, n):
        return w[name] if m.add_bias_linear else torch.zeros(n)

    def expand(t):  # GQA: query head j uses key/value group j // (a/g); GPT-2 has one k/v per head
        return t.reshape(g, d, *t.shape[1:]).repeat_interleave(a // g, dim=0).reshape(a * d, *t.shape[1:])

    out = OrderedDict()
    out["transformer.wte.weight"] = w["0.word_embeddings.weight"]
    out["transformer.wpe.weight"] = w["0.position_embeddings.weight"]
    for i in range(1, L + 1):
        p, hf = f"{i}.", f"transformer.h.{i - 1}."
        out[hf + "ln_1.weight"] = w[p + "input_layernorm.weight"]
        out[hf + "ln_1.bias"] = w[p + "input_layernorm.bias"]
        q, k, v = _split_qkv(w[p + "self_attention.linear_qkv.weight"], m)
        out[hf + "attn.c_attn.weight"] = torch.cat([q, expand(k), expand(v)], dim=0).t()
        qkv_b = (w[p + "self_attention.linear_qkv.bias"] if m.qkv_bias else torch.zeros((a + 2 * g) * d))
        qb, kb, vb = _split_qkv(qkv_b, m)
        out[hf + "attn.c_attn.bias"] = torch.cat([qb, expand(kb), expand(vb)])
        out[hf + "attn.c_proj.weight"] = w[p + "self_attention.linear_proj.weight"].t()
        out[hf + "attn.c_proj.bias"] = bias(p + "self_attention.linear_proj.bias", h)
        out[hf + "ln_2.weight"] = w[p + "pre_mlp_layernorm.weight"]
        out[hf + "ln_2.bias"] = w[p + "pre_mlp_layernorm.bias"]
        out[hf + "mlp.c_fc.weight"] = w[p + "mlp.linear_fc1.weight"].t()
        out[hf + "mlp.c_fc.bias"] = bias(p + "mlp.linear_fc1.bias", f)
        out[hf + "mlp.c_proj.weight"] = w[p + "mlp.linear_fc2.weight"].t()
        out[hf + "mlp.c_proj.bias"] = bias(p + "mlp.linear_fc2.bias", h)
    out["transformer.ln_f.weight"] = w[f"{L + 1}.norm.weight"]
    out["transformer.ln_f.bias"] = w[f"{L + 1}.norm.bias"]
    if not m.tied_embeddings:
        out["lm_head.weight"] = w[f"{L + 2}.output_layer.weight"]
    return OrderedDict((k, v.contiguous().clone()) for k, v in out.items())


def to_hf(w: dict, m, tokenizer_ids: dict | None = None):
    """(transformers config, HF state dict) for the recipe's model section."""
    if family(m) in LLAMA_STYLE_ARCHITECTURES:
        return llama_style_config(m, tokenizer_ids), to_llama(w, m)
    if m.mla is not None:
        from recipes.hf.deepseek import deepseek_config, to_deepseek

        return deepseek_config(m, tokenizer_ids), to_deepseek(w, m)
    if m.moe is not None:
        from recipes.hf.moe_families import moe_config

        return moe_config(m, tokenizer_ids), to_llama(w, m)
    return gpt2_config(m, tokenizer_ids), to_gpt2(w, m)

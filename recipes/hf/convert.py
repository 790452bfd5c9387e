"""Canonical full state (see `recipes.checkpoint.shards`) <-> Hugging Face transformers state dicts and configs.

Families:
  * rope + rmsnorm + swiglu            -> `LlamaForCausalLM` (GQA as num_key_value_heads, biases as attention_bias /
                                          mlp_bias, tied or untied head)
  * learned + layernorm + gelu         -> `GPT2LMHeadModel` (activation gelu_pytorch_tanh = our tanh GeLU exactly;
                                          zero biases when the recipe has none; GQA key/value heads repeated)
  * anything else                      -> `UnsupportedModel` naming the option.

Our layer numbering (pipeline index): 0 embedding, 1..L decoder layers (HF layer i-1), L+1 final norm, L+2 head.
"""
from __future__ import annotations

from collections import OrderedDict

import torch


class UnsupportedModel(ValueError):
    """The recipe's (or the HF model's) architecture has no exact counterpart on the other side."""


def family(model_cfg) -> str:
    m = model_cfg
    if (m.position_embedding, m.normalization, m.activation) == ("rope", "rmsnorm", "swiglu"):
        return "llama"
    if (m.position_embedding, m.normalization, m.activation) == ("learned", "layernorm", "gelu"):
        return "gpt2"
    raise UnsupportedModel(
        f"model.position_embedding={m.position_embedding}, model.normalization={m.normalization}, "
        f"model.activation={m.activation}: export supports rope+rmsnorm+swiglu (Llama) or "
        "learned+layernorm+gelu (GPT-2) only")


def _dims(m):
    a, g, h = m.num_attention_heads, m.query_groups, m.hidden_size
    return a, g, h // a, h


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


# ------------------------------------------------------------------------------------------------------- Llama
def llama_config(m, tokenizer_ids: dict | None = None):
    from transformers import LlamaConfig

    ids = tokenizer_ids or {}
    a, g, d, h = _dims(m)
    return LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=h, intermediate_size=m.ffn_size, num_hidden_layers=m.num_layers,
        num_attention_heads=a, num_key_value_heads=g, head_dim=d, hidden_act="silu",
        max_position_embeddings=m.seq_length, rms_norm_eps=m.norm_epsilon, tie_word_embeddings=m.tied_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": float(m.rotary_base)},
        attention_bias=m.add_bias_linear, mlp_bias=m.add_bias_linear, initializer_range=m.init_method_std,
        bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"), pad_token_id=ids.get("pad"), dtype="float32",
        architectures=["LlamaForCausalLM"])


def to_llama(w: dict, m) -> OrderedDict:
    L = m.num_layers
    out = OrderedDict()
    out["model.embed_tokens.weight"] = w["0.word_embeddings.weight"]
    for i in range(1, L + 1):
        p, hf = f"{i}.", f"model.layers.{i - 1}."
        out[hf + "input_layernorm.weight"] = w[p + "input_layernorm.weight"]
        out[hf + "post_attention_layernorm.weight"] = w[p + "pre_mlp_layernorm.weight"]
        for kind in ("weight", "bias") if m.add_bias_linear else ("weight",):
            q, k, v = _split_qkv(w[p + f"self_attention.linear_qkv.{kind}"], m)
            out[hf + f"self_attn.q_proj.{kind}"] = q
            out[hf + f"self_attn.k_proj.{kind}"] = k
            out[hf + f"self_attn.v_proj.{kind}"] = v
            out[hf + f"self_attn.o_proj.{kind}"] = w[p + f"self_attention.linear_proj.{kind}"]
            gate, up = w[p + f"mlp.linear_fc1.{kind}"].chunk(2, dim=0)
            out[hf + f"mlp.gate_proj.{kind}"] = gate
            out[hf + f"mlp.up_proj.{kind}"] = up
            out[hf + f"mlp.down_proj.{kind}"] = w[p + f"mlp.linear_fc2.{kind}"]
    out["model.norm.weight"] = w[f"{L + 1}.norm.weight"]
    if not m.tied_embeddings:
        out["lm_head.weight"] = w[f"{L + 2}.output_layer.weight"]
    return OrderedDict((k, v.contiguous().clone()) for k, v in out.items())


def from_llama(hf: dict, m) -> OrderedDict:
    """Inverse of `to_llama` (HF names -> canonical names)."""
    L = m.num_layers
    w = OrderedDict()

    def take(name):
        if name not in hf:
            raise UnsupportedModel(f"the transformers checkpoint has no tensor '{name}' (not a Llama-style model?)")
        return hf[name]

    w["0.word_embeddings.weight"] = take("model.embed_tokens.weight")
    for i in range(1, L + 1):
        p, h = f"{i}.", f"model.layers.{i - 1}."
        w[p + "input_layernorm.weight"] = take(h + "input_layernorm.weight")
        for kind in ("weight", "bias") if m.add_bias_linear else ("weight",):
            w[p + f"self_attention.linear_qkv.{kind}"] = _join_qkv(
                take(h + f"self_attn.q_proj.{kind}"), take(h + f"self_attn.k_proj.{kind}"),
                take(h + f"self_attn.v_proj.{kind}"), m)
            w[p + f"self_attention.linear_proj.{kind}"] = take(h + f"self_attn.o_proj.{kind}")
            w[p + f"mlp.linear_fc1.{kind}"] = torch.cat([take(h + f"mlp.gate_proj.{kind}"),
                                                        take(h + f"mlp.up_proj.{kind}")], dim=0)
            w[p + f"mlp.linear_fc2.{kind}"] = take(h + f"mlp.down_proj.{kind}")
        w[p + "pre_mlp_layernorm.weight"] = take(h + "post_attention_layernorm.weight")
    w[f"{L + 1}.norm.weight"] = take("model.norm.weight")
    if not m.tied_embeddings:
        w[f"{L + 2}.output_layer.weight"] = take("lm_head.weight")
    return OrderedDict((k, v.float().contiguous().clone()) for k, v in w.items())


def model_fields_from_llama_config(cfg) -> dict:
    """Recipe `model.*` fields of a transformers LlamaConfig; refuses what our model cannot represent exactly."""
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    problems = []
    if getattr(cfg, "model_type", "llama") != "llama":
        problems.append(f"model_type={cfg.model_type} (only llama is supported)")
    if rope_type != "default":
        problems.append(f"rope_parameters.rope_type={rope_type} (only the default RoPE is supported)")
    if cfg.hidden_act != "silu":
        problems.append(f"hidden_act={cfg.hidden_act} (SwiGLU needs silu)")
    if getattr(cfg, "attention_bias", False) != getattr(cfg, "mlp_bias", False):
        problems.append("attention_bias != mlp_bias (our model.add_bias_linear covers both)")
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
        "position_embedding": "rope", "normalization": "rmsnorm", "activation": "swiglu",
        "rotary_base": float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))),
        "norm_epsilon": cfg.rms_norm_eps, "tied_embeddings": bool(cfg.tie_word_embeddings),
        "add_bias_linear": bool(getattr(cfg, "attention_bias", False)),
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
        qkv_b = bias(p + "self_attention.linear_qkv.bias", (a + 2 * g) * d)
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
    fam = family(m)
    if fam == "llama":
        return llama_config(m, tokenizer_ids), to_llama(w, m)
    return gpt2_config(m, tokenizer_ids), to_gpt2(w, m)

"""DeepSeek-V3 in transformers (`DeepseekV3ForCausalLM`, model_type deepseek_v3) <-> our model with model.mla,
DeepSeek routing (model.moe score_function sigmoid) and model.mtp: the family's rules, its config both ways and its
tensor names (declarative maps, as recipes.hf.convert's for the Llama-style families).

What makes a recipe DeepSeek-V3: MLA, RMSNorm, SwiGLU, RoPE; model.moe with sigmoid scores, a shared expert of
n x the routed expert size, the first first_dense_layers layers dense and every other layer MoE, no shared-expert gate
and no biases. Our names (layer i, HF model.layers.{i-1}) <-> transformers':

  | ours (self_attention. / mlp.)                       | transformers (self_attn. / mlp.)                       |
  |-----------------------------------------------------|--------------------------------------------------------|
  | linear_q_down_proj / q_layernorm / linear_q_up_proj | q_a_proj / q_a_layernorm / q_b_proj                    |
  | linear_q_proj (q_lora_rank None)                    | q_proj                                                 |
  | linear_kv_down_proj / kv_layernorm / linear_kv_up_proj | kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj     |
  | linear_proj                                         | o_proj                                                 |
  | router.weight / router.expert_bias                  | gate.weight / gate.e_score_correction_bias             |
  | experts.linear_fc1 / linear_fc2                     | experts.gate_up_proj / down_proj (stacked [E, ...])    |
  | shared_experts.linear_fc1 / fc2                     | shared_experts.[gate_proj; up_proj] / down_proj        |

MTP depth k (ours: pipeline index L+2+k) is DeepSeek's layer L+k-1 (model.layers.61 of DeepSeek-V3): the decoder
layer's names above plus enorm, hnorm, eh_proj, shared_head.norm (our final_layernorm) and copies of the embedding
(embed_tokens) and head (shared_head.head), as DeepSeek ships them. transformers' DeepseekV3ForCausalLM does not load
them (it ignores DeepSeek-V3's layer 61 and reports other indices as unexpected keys); its MTP drafting
(generate(use_mtp=True), MtpModel) loads them by these names. Import reads them from the safetensors files.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch

from recipes.hf.convert import LLAMA_MLP_MAP, UnsupportedModel, _max_positions, _rope_parameters

ARCHITECTURE = "DeepseekV3ForCausalLM"

# (ours, transformers, how, when): how "copy" | "cat" ([gate; up]); when: None | "q_lora" | "q_full" | "shared"
ATTENTION_MAP = (
    ("input_layernorm.weight", ("input_layernorm.weight",), "copy", None),
    ("self_attention.linear_q_down_proj.weight", ("self_attn.q_a_proj.weight",), "copy", "q_lora"),
    ("self_attention.q_layernorm.weight", ("self_attn.q_a_layernorm.weight",), "copy", "q_lora"),
    ("self_attention.linear_q_up_proj.weight", ("self_attn.q_b_proj.weight",), "copy", "q_lora"),
    ("self_attention.linear_q_proj.weight", ("self_attn.q_proj.weight",), "copy", "q_full"),
    ("self_attention.linear_kv_down_proj.weight", ("self_attn.kv_a_proj_with_mqa.weight",), "copy", None),
    ("self_attention.kv_layernorm.weight", ("self_attn.kv_a_layernorm.weight",), "copy", None),
    ("self_attention.linear_kv_up_proj.weight", ("self_attn.kv_b_proj.weight",), "copy", None),
    ("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), "copy", None),
    ("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "copy", None),
)
MOE_MAP = (
    ("mlp.router.weight", ("mlp.gate.weight",), "copy", None),
    ("mlp.router.expert_bias", ("mlp.gate.e_score_correction_bias",), "copy", None),
    ("mlp.experts.linear_fc1.weight", ("mlp.experts.gate_up_proj",), "copy", None),
    ("mlp.experts.linear_fc2.weight", ("mlp.experts.down_proj",), "copy", None),
    ("mlp.shared_experts.linear_fc1.weight",
     ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"), "cat", None),
    ("mlp.shared_experts.linear_fc2.weight", ("mlp.shared_experts.down_proj.weight",), "copy", None),
)
DEPTH_MAP = (  # what a prediction depth adds to its decoder layer
    ("enorm.weight", ("enorm.weight",), "copy", None),
    ("hnorm.weight", ("hnorm.weight",), "copy", None),
    ("eh_proj.weight", ("eh_proj.weight",), "copy", None),
    ("final_layernorm.weight", ("shared_head.norm.weight",), "copy", None),
)
OUTER_MAP = (("0.word_embeddings.weight", "model.embed_tokens.weight"), ("{norm}.norm.weight", "model.norm.weight"),
             ("{head}.output_layer.weight", "lm_head.weight"))


def deepseek_problems(m) -> list[str]:
    """Why a recipe with model.mla is not a DeepSeek-V3 (empty: it is)."""
    moe, out = m.moe, []
    if (m.normalization, m.activation, m.tied_embeddings) != ("rmsnorm", "swiglu", False):
        out.append("DeepSeek-V3 is RMSNorm + SwiGLU with an untied head")
    if moe is None:
        return out + ["model.moe is missing (DeepSeek-V3's layers after first_dense_layers are MoE)"]
    if moe.score_function != "sigmoid":
        out.append("model.moe.score_function must be sigmoid")
    shared = moe.shared_expert_ffn_size
    if not shared or shared % m.expert_ffn_size or moe.shared_expert_gate:
        out.append("model.moe.shared_expert_ffn_size must be a multiple of the expert ffn size, without a gate "
                   "(n_shared_experts x moe_intermediate_size)")
    if [m.is_moe_layer(i) for i in range(m.num_layers)] != [i >= moe.first_dense_layers for i in range(m.num_layers)]:
        out.append("the layers must be first_dense_layers dense ones, then all MoE (model.moe.layer_pattern: 1)")
    return out


def check(m) -> str:
    problems = deepseek_problems(m)
    if problems:
        raise UnsupportedModel("model.mla: exports as DeepseekV3ForCausalLM only, and this recipe is not one: "
                               + "; ".join(problems))
    return "deepseek_v3"


def deepseek_config(m, tokenizer_ids: dict | None = None):
    from transformers import DeepseekV3Config

    ids, moe, mla = tokenizer_ids or {}, m.moe, m.mla
    groups = moe.num_groups or 1
    return DeepseekV3Config(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.ffn_size,
        moe_intermediate_size=m.expert_ffn_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_attention_heads,
        n_shared_experts=moe.shared_expert_ffn_size // m.expert_ffn_size, n_routed_experts=moe.num_experts,
        routed_scaling_factor=moe.routed_scaling_factor, kv_lora_rank=mla.kv_lora_rank, q_lora_rank=mla.q_lora_rank,
        qk_rope_head_dim=mla.qk_rope_head_dim, v_head_dim=mla.v_head_dim, qk_nope_head_dim=mla.qk_nope_head_dim,
        n_group=groups, topk_group=moe.group_top_k or groups, num_experts_per_tok=moe.top_k,
        first_k_dense_replace=moe.first_dense_layers, norm_topk_prob=moe.normalize_top_k, hidden_act="silu",
        max_position_embeddings=_max_positions(m), initializer_range=m.init_method_std, rms_norm_eps=m.norm_epsilon,
        tie_word_embeddings=False, rope_parameters=_rope_parameters(m), rope_interleave=True, attention_bias=False,
        num_mtp_layers=m.mtp_depths, bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"),
        pad_token_id=ids.get("pad"), dtype="float32", architectures=[ARCHITECTURE])


# ---------------------------------------------------------------------------------------------------- tensors
def _present(when, m) -> bool:
    return {None: True, "q_lora": m.mla.q_lora_rank is not None, "q_full": m.mla.q_lora_rank is None}[when]


def _rows(m):
    """(our name, transformers names, how) of every tensor, decoder layers then prediction depths."""
    L = m.num_layers
    for ours, hf in OUTER_MAP:
        yield ours.format(norm=L + 1, head=L + 2), (hf,), "copy"
    layers = [(i, i - 1, m.is_moe_layer(i - 1), ()) for i in range(1, L + 1)]
    layers += [(L + 2 + k, L + k - 1, True, DEPTH_MAP) for k in range(1, m.mtp_depths + 1)]
    for i, hf_index, moe, extra in layers:
        for ours, hf, how, when in ATTENTION_MAP + (MOE_MAP if moe else LLAMA_MLP_MAP) + extra:
            if when in (None, "q_lora", "q_full") and _present(when, m):
                yield f"{i}.{ours}", tuple(f"model.layers.{hf_index}.{n}" for n in hf), how


def to_deepseek(w: dict, m) -> OrderedDict:
    """Canonical names -> transformers' (and DeepSeek's, for the MTP depths); a missing router bias is zeros."""
    out = OrderedDict()
    for ours, hf_names, how in _rows(m):
        t = w.get(ours)
        if t is None and ours.endswith("mlp.router.expert_bias"):  # trained without the bias: transformers' zeros
            t = torch.zeros(m.moe.num_experts)
        out.update(zip(hf_names, t.chunk(2, dim=0) if how == "cat" else (t,)))
    L = m.num_layers
    for k in range(1, m.mtp_depths + 1):  # DeepSeek ships the shared embedding and head with each depth
        out[f"model.layers.{L + k - 1}.embed_tokens.weight"] = w["0.word_embeddings.weight"]
        out[f"model.layers.{L + k - 1}.shared_head.head.weight"] = w[f"{L + 2}.output_layer.weight"]
    return OrderedDict((k, v.contiguous().clone()) for k, v in out.items())


def from_deepseek(hf: dict, m) -> OrderedDict:
    """Inverse of `to_deepseek` (transformers' names, with the depths' -> canonical names)."""
    def take(name):
        if name not in hf:
            raise UnsupportedModel(f"the DeepSeek-V3 checkpoint has no tensor '{name}' (config.json does not match "
                                   "the weights?)")
        return hf[name]

    w = OrderedDict()
    for ours, hf_names, how in _rows(m):
        parts = [take(n) for n in hf_names]
        w[ours] = torch.cat(parts, dim=0) if how == "cat" else parts[0]
    return OrderedDict((k, v.float().contiguous().clone()) for k, v in w.items())


def depth_tensors(hf_dir: str, num_layers: int, depths: int) -> dict:
    """The MTP depths' tensors (model.layers.{L} .. {L+D-1}) from the directory's safetensors files, experts
    stacked as transformers stacks them (DeepSeek's own files keep one tensor per expert)."""
    from safetensors import safe_open

    prefixes = tuple(f"model.layers.{num_layers + k}." for k in range(depths))
    found = {}
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            found.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(prefixes)})
    return _stack_experts(found)


def _stack_experts(t: dict) -> dict:
    """model.layers.N.mlp.experts.J.{gate,up,down}_proj.weight -> mlp.experts.gate_up_proj / down_proj [E, ...]."""
    import re

    per: dict = {}
    for name in list(t):
        hit = re.fullmatch(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight", name)
        if hit:
            per.setdefault(hit.group(1), {}).setdefault(int(hit.group(2)), {})[hit.group(3)] = t.pop(name)
    for prefix, experts in per.items():
        order = [experts[j] for j in sorted(experts)]
        t[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([e["gate"], e["up"]]) for e in order])
        t[f"{prefix}.down_proj"] = torch.stack([e["down"] for e in order])
    return t


# ------------------------------------------------------------------------------------------------------- import
def model_fields(cfg, rope_fields, mtp_depths: int) -> dict:
    """Recipe `model.*` fields of a DeepseekV3Config (`mtp_depths`: how many MTP depths the directory holds)."""
    problems: list[str] = []
    rope = _yarn_fields(cfg, problems) if _rope_type(cfg) == "yarn" else rope_fields(cfg, problems)
    if cfg.hidden_act != "silu":
        problems.append(f"hidden_act={cfg.hidden_act} (SwiGLU needs silu)")
    if getattr(cfg, "attention_bias", False):
        problems.append("attention_bias=true (our MLA has no biases)")
    if not getattr(cfg, "rope_interleave", True):
        problems.append("rope_interleave=false (ours rotates DeepSeek's interleaved pairs)")
    if getattr(cfg, "quantization_config", None):
        problems.append("quantization_config is set (FP8 weights): dequantize to bf16 first")
    if cfg.n_shared_experts < 1:
        problems.append("n_shared_experts=0 (DeepSeek-V3 has shared experts)")
    if problems:
        raise UnsupportedModel("cannot import this transformers model (deepseek_v3): " + "; ".join(problems))
    groups = cfg.n_group if (cfg.n_group or 1) > 1 else None
    moe = {"num_experts": cfg.n_routed_experts, "top_k": cfg.num_experts_per_tok,
           "ffn_hidden_size": cfg.moe_intermediate_size,
           "shared_expert_ffn_size": cfg.n_shared_experts * cfg.moe_intermediate_size, "shared_expert_gate": False,
           "normalize_top_k": bool(cfg.norm_topk_prob), "layer_pattern": 1,
           "first_dense_layers": cfg.first_k_dense_replace, "score_function": "sigmoid", "num_groups": groups,
           "group_top_k": cfg.topk_group if groups else None, "routed_scaling_factor": float(cfg.routed_scaling_factor),
           "expert_bias": True, "capacity_factor": None}
    mla = {"q_lora_rank": cfg.q_lora_rank, "kv_lora_rank": cfg.kv_lora_rank, "qk_nope_head_dim": cfg.qk_nope_head_dim,
           "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim}
    return {
        "num_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads, "num_query_groups": None, "head_dim": None,
        "ffn_hidden_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size, "position_embedding": "rope",
        "normalization": "rmsnorm", "activation": "swiglu", **rope, "norm_epsilon": cfg.rms_norm_eps,
        "tied_embeddings": False, "add_bias_linear": False, "add_qkv_bias": False, "qk_norm": False,
        "moe": moe, "mla": mla, "mtp": {"num_layers": mtp_depths} if mtp_depths else None,
    }


def _rope_type(cfg) -> str:
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    return rope.get("rope_type", rope.get("type", "default"))


def _yarn_fields(cfg, problems: list) -> dict:
    """model.rotary_base and model.rope_scaling of a yarn config (DeepSeek-V3: factor 40 over 4096 positions)."""
    rope = dict(cfg.rope_parameters)
    if rope.get("attention_factor") is not None:
        problems.append("rope_parameters.attention_factor is set (ours derives it from mscale / mscale_all_dim)")
    if not rope.get("truncate", True):
        problems.append("rope_parameters.truncate=false (ours rounds the correction range, transformers' default)")
    original = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor") or cfg.max_position_embeddings / original
    return {"rotary_base": float(rope.get("rope_theta", 10000.0)), "rope_scaling": {
        "type": "yarn", "factor": float(factor), "original_max_position_embeddings": original,
        "beta_fast": float(rope.get("beta_fast") or 32), "beta_slow": float(rope.get("beta_slow") or 1),
        "mscale": float(rope.get("mscale") or 0), "mscale_all_dim": float(rope.get("mscale_all_dim") or 0)}}


def mtp_depths_in(hf_dir: str, cfg) -> int:
    """How many of config.json's num_nextn_predict_layers depths have their weights in the directory."""
    from safetensors import safe_open

    wanted = getattr(cfg, "num_mtp_layers", 0) or 0
    keys = set()
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            keys.update(f.keys())
    L = cfg.num_hidden_layers
    return sum(1 for k in range(wanted) if f"model.layers.{L + k}.eh_proj.weight" in keys)


# ------------------------------------------------------------------------------------------------------- export
def split_depths(hf_state: dict, m) -> tuple[OrderedDict, OrderedDict]:
    """(what DeepseekV3ForCausalLM holds, the MTP depths' tensors, which it does not)."""
    prefixes = tuple(f"model.layers.{m.num_layers + k}." for k in range(m.mtp_depths))
    main = OrderedDict((k, v) for k, v in hf_state.items() if not k.startswith(prefixes))
    return main, OrderedDict((k, v) for k, v in hf_state.items() if k.startswith(prefixes))


def write_depths(out: Path, depths: dict) -> None:
    """Add the MTP depths' tensors to a save_pretrained directory as one more safetensors shard listed in
    model.safetensors.index.json (a single model.safetensors becomes shard 1 of 2: transformers prefers a single
    file over an index, and its MTP loader reads the index)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    index_path = out / "model.safetensors.index.json"
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        shards = sorted(set(index["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
        with safe_open(str(out / shards[0]), "pt") as f:
            index = {"metadata": {}, "weight_map": dict.fromkeys(f.keys(), shards[0])}
    n = len(shards) + 1
    renamed = {s: f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i, s in enumerate(shards)}
    for old, new in renamed.items():
        (out / old).rename(out / new)
    name = f"model-{n:05d}-of-{n:05d}.safetensors"
    save_file({k: v.contiguous() for k, v in depths.items()}, str(out / name), metadata={"format": "pt"})
    weight_map = {k: renamed[v] for k, v in index["weight_map"].items()} | dict.fromkeys(depths, name)
    size = sum((out / s).stat().st_size for s in [*renamed.values(), name])
    index_path.write_text(json.dumps({"metadata": {**index.get("metadata", {}), "total_size": size},
                                      "weight_map": weight_map}, indent=1))

"""Tiny random DeepSeek-V3 models made with transformers' own class (the reference of the DeepSeek interop tests):
MLA with q compression, 8 routed experts in 4 groups (top-2 from the best 2 groups), a shared expert, the first layer
dense, a non-zero score-correction bias; and optionally MTP depths written in DeepSeek's own layout (one tensor per
expert, as DeepSeek-V3's release ships layer 61), which transformers' DeepseekV3ForCausalLM does not build."""
from __future__ import annotations

from pathlib import Path

import torch

HF_SHAPE = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
                kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=4,
                topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
                norm_topk_prob=True, rms_norm_eps=1e-6, tie_word_embeddings=False, num_mtp_layers=0,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def hf_deepseek(vocab_size: int, seed: int = 0, **overrides):
    """A random DeepseekV3ForCausalLM (eval mode) with a non-zero e_score_correction_bias in every MoE layer."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(**{**HF_SHAPE, "vocab_size": vocab_size, "max_position_embeddings": 256, **overrides})
    model = DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.normal_(0.0, 0.05)
    return model


def add_released_style_depths(hf_dir: Path, recipe, main_state: dict, seed: int = 5) -> dict:
    """Write random MTP depth tensors into a save_pretrained directory the way DeepSeek's release ships them (layer
    L's names, one tensor per expert, shard listed in the index, with copies of the main model's embedding and head
    from `main_state`) and set num_nextn_predict_layers; returns them."""
    import json

    from tests.support.plain_model import init_single_process
    from recipes.hf.deepseek import to_deepseek, write_depths
    from recipes.model.layers import PlainDecoder
    from recipes.parallel.layout import Layout

    init_single_process()
    torch.manual_seed(seed)
    model = PlainDecoder(recipe, Layout(tp=1, pp=1, dp=1, zero_stage=0))
    weights = {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    weights["0.word_embeddings.weight"] = weights["0.word_embeddings.weight"][:recipe.model.vocab_size]
    head = f"{recipe.model.num_layers + 2}.output_layer.weight"
    weights[head] = weights[head][:recipe.model.vocab_size]
    L = recipe.model.num_layers
    depth = {k: v for k, v in to_deepseek(weights, recipe.model).items() if k.startswith(f"model.layers.{L}.")}
    depth[f"model.layers.{L}.mlp.gate.e_score_correction_bias"] = torch.randn(recipe.model.moe.num_experts) * 0.05
    depth[f"model.layers.{L}.embed_tokens.weight"] = main_state["model.embed_tokens.weight"]
    depth[f"model.layers.{L}.shared_head.head.weight"] = main_state["lm_head.weight"]
    released = dict(depth)
    gate_up, down = released.pop(f"model.layers.{L}.mlp.experts.gate_up_proj"), \
        released.pop(f"model.layers.{L}.mlp.experts.down_proj")
    for j in range(gate_up.shape[0]):
        gate, up = gate_up[j].chunk(2, dim=0)
        for part, t in (("gate", gate), ("up", up), ("down", down[j])):
            released[f"model.layers.{L}.mlp.experts.{j}.{part}_proj.weight"] = t.contiguous()
    write_depths(hf_dir, released)
    config = json.loads((hf_dir / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (hf_dir / "config.json").write_text(json.dumps(config, indent=1))
    return depth

"""Context parallelism (recipes.model.context_attention) in the cost model: the gathered keys and values a layer keeps
and moves, and the CP collectives per micro-batch."""
from __future__ import annotations

from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.compute import stage_layer_count
from recipes.planner.links import cp_link


def cp_kv_bytes(model_cfg, layout: Layout, act_bytes: int) -> float:
    """Bytes of one layer's gathered keys and values on one rank: the whole sequence's K and V of this TP rank's
    query groups (the all-gather's output; the reduce-scatter of their gradients moves the same)."""
    if model_cfg.mla is not None:  # MLA gathers each head's key (dn + dr) and value (dv) after the up-projections
        mla = model_cfg.mla
        width = model_cfg.num_attention_heads / layout.tp * (mla.qk_nope_head_dim + mla.qk_rope_head_dim
                                                              + mla.v_head_dim)
        return model_cfg.seq_length * layout.micro_batch * width * act_bytes
    head_dim = model_cfg.hidden_size // model_cfg.num_attention_heads
    groups = model_cfg.query_groups / layout.tp
    return model_cfg.seq_length * layout.micro_batch * 2 * groups * head_dim * act_bytes


def cp_gathered_kv_bytes(model_cfg, layout: Layout, act_bytes: int) -> float:
    """Activation bytes a layer keeps for backward beyond its own chunks under CP: the other ranks' K and V, which
    the attention kernel saves (the local share is already in the per-layer activations)."""
    if layout.cp <= 1:
        return 0.0
    return cp_kv_bytes(model_cfg, layout, act_bytes) * (1 - 1 / layout.cp)


def cp_seconds(model_cfg, cluster, layout: Layout, priced: Layout, act_bytes: int, assume: Assumptions) -> float:
    """CP collectives of one micro-batch on the slowest stage, as recipes.model.context_attention runs them: per
    layer one all-gather of K and V (one collective for both) in the forward, again in the recompute forward under
    full recompute, and one reduce-scatter of their gradients in the backward. None is overlapped with compute (a
    ring would hide its transfers behind blocks of attention; the gather keeps document masks simple, Llama 3's
    choice), so all of it is on the critical path."""
    if layout.cp <= 1:
        return 0.0
    link = cp_link(cluster, layout, assume)
    kv = cp_kv_bytes(model_cfg, layout, act_bytes)
    gathers = 2 if priced.recompute == "full" else 1
    per_layer = gathers * link.seconds(kv, "all_gather") + link.seconds(kv, "reduce_scatter")
    return stage_layer_count(model_cfg.num_layers, layout.pp, model_cfg.mtp_depths) * per_layer

"""Which pipeline stage holds which layer, and the one split DeepSpeed's ZeRO-1 cannot run.

The pipeline's layer specs are: embedding, decoder layers 1..L, final norm, output head (recipes.model.layers.layer_specs).
`parallel.pipeline_partition` picks how DeepSpeed cuts them into stages:

- "uniform" (default): the decoder layers split as evenly as possible (DeepSpeed `type:DecoderLayerPipe`); the
  embedding joins the first stage, the final norm and head the last — Megatron-LM's split, and the one the planner
  models (ceil(L / pp) layers on the busiest stage).
- "parameters": DeepSpeed balances parameter counts over all specs. With a large vocabulary and few layers this can
  give the embedding or the head a stage of its own.

Why a stage without a decoder layer matters: each rank's optimizer puts matrices (weight decay) and norms/biases (no
decay) in separate param groups, and DeepSpeed drops a group that is empty on that rank. ZeRO-1 then all-reduces the
gradient norm once per group over the model-parallel (TP x PP) group, so stages with different group counts issue
different numbers of collectives and the job hangs in the first optimizer step (DeepSpeed issue #1522). We refuse
such a split before start (validation) and again at engine build time (the split DeepSpeed actually chose).
"""
from __future__ import annotations

from recipes.model.shape import layer_parameters, moe_layer_parameters, norm_params

# Optimizer param groups each pipeline layer type contributes to (see recipes.train.engine.build_optimizer: parameters
# with >= 2 dims are decayed, the rest are not).
GROUPS_OF_LAYER = {
    "EmbeddingPipe": frozenset({"decay"}),  # word (and learned position) embeddings: matrices only
    "DecoderLayerPipe": frozenset({"decay", "no_decay"}),
    # with parallel.ep > 1 the experts are one more group (DeepSpeed's MoE param group, reduced over the expert-data-
    # parallel group); with ep = 1 they are ordinary matrices
    "MoEDecoderLayerPipe": frozenset({"decay", "no_decay", "experts"}),
    "FinalNormPipe": frozenset({"no_decay"}),
    "OutputHeadPipe": frozenset({"decay"}),
}


UNEVEN_GROUPS_FIX = ("DeepSpeed's ZeRO-1 would hang in the first optimizer step (it all-reduces the gradient norm "
                     "once per group across stages). Use parallel.pipeline_partition=uniform (every stage gets "
                     "decoder layers) or parallel.zero_stage=0")


def layer_names(model_cfg) -> list[str]:
    """The spec type names in pipeline order (a tied head is an EmbeddingPipe, as in recipes.model.layers.layer_specs)."""
    head = "EmbeddingPipe" if model_cfg.tied_embeddings else "OutputHeadPipe"
    decoders = ["MoEDecoderLayerPipe" if model_cfg.is_moe_layer(i) else "DecoderLayerPipe"
                for i in range(model_cfg.num_layers)]
    return ["EmbeddingPipe"] + decoders + ["FinalNormPipe", head]


def deepspeed_method(partition: str) -> str:
    """The PipelineModule partition_method for a recipe's parallel.pipeline_partition."""
    return "parameters" if partition == "parameters" else "type:DecoderLayerPipe"


def layer_weights(model_cfg, tp: int, partition: str, ep: int = 1) -> list[float]:
    """What DeepSpeed balances: per-spec trainable parameters on one TP (and EP) rank, or 1 per decoder layer."""
    names = layer_names(model_cfg)
    if partition != "parameters":
        return [1.0 if n.endswith("DecoderLayerPipe") else 0.0 for n in names]
    h = model_cfg.hidden_size
    embedding = model_cfg.padded_vocab_size(tp) * h / tp
    if model_cfg.position_embedding == "learned":
        embedding += model_cfg.seq_length * h
    split, replicated = layer_parameters(model_cfg)
    count = {"EmbeddingPipe": embedding, "DecoderLayerPipe": split / tp + replicated,
             "FinalNormPipe": norm_params(model_cfg), "OutputHeadPipe": model_cfg.padded_vocab_size(tp) * h / tp}
    if model_cfg.moe is not None:
        m_split, m_rep, experts = moe_layer_parameters(model_cfg)
        count["MoEDecoderLayerPipe"] = m_split / tp + m_rep + experts / ep / tp
    return [count[n] for n in names]


def stage_boundaries(model_cfg, tp: int, pp: int, partition: str, ep: int = 1) -> list[int]:
    """DeepSpeed's own split (its partition_balanced): stage s holds specs [parts[s], parts[s + 1])."""
    weights = layer_weights(model_cfg, tp, partition, ep)
    if partition != "parameters":  # 0/1 weights: the same split without importing DeepSpeed (`plan` stays light)
        return balanced_split(weights, pp)
    from deepspeed.runtime.utils import partition_balanced

    return [int(b) for b in partition_balanced(weights=weights, num_parts=pp)]


def balanced_split(weights: list[float], num_parts: int) -> list[int]:
    """deepspeed.runtime.utils.partition_balanced (DeepSpeed 0.19, Apache-2.0) in plain Python: the linear partition
    minimising max - min part weight, ties broken the same way (the last candidate wins), so the boundaries are
    DeepSpeed's (tests/recipes/test_moe_rules.py compares them)."""
    n, m = len(weights), num_parts
    if n <= m:
        return [min(p, n) for p in range(m + 1)]
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    hi = [[inf] * (m + 1) for _ in range(n + 1)]
    lo = [[inf] * (m + 1) for _ in range(n + 1)]
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    cut = [[0] * (m + 1) for _ in range(n + 1)]
    hi[0][0] = cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                top, bottom = max(hi[k][j - 1], part), min(lo[k][j - 1], part)
                if cost[i][j] >= top - bottom:
                    cost[i][j], hi[i][j], lo[i][j], cut[i][j] = top - bottom, top, bottom, k
    parts = [n]
    for j in reversed(range(1, m + 1)):
        parts.append(cut[parts[-1]][j])
    return parts[::-1]


def _groups(name: str, ep: int) -> frozenset:
    groups = GROUPS_OF_LAYER[name]
    return groups if ep > 1 else groups - {"experts"}


def uneven_group_problem(names: list[str], parts: list[int], ep: int = 1) -> str | None:
    """None when every stage's optimizer has the same number of param groups, else what is wrong, per stage."""
    per_stage = []
    for s in range(len(parts) - 1):
        held = names[parts[s]:parts[s + 1]]
        groups = frozenset().union(*(_groups(n, ep) for n in held)) if held else frozenset()
        per_stage.append((s, held, groups))
    if len({len(g) for _, _, g in per_stage}) <= 1:
        return None
    lines = [f"stage {s}: {_describe(held)} -> {len(g)} optimizer param group(s)" for s, held, g in per_stage]
    return "; ".join(lines)


def _describe(held: list[str]) -> str:
    layers, moe = held.count("DecoderLayerPipe"), held.count("MoEDecoderLayerPipe")
    others = [n for n in held if not n.endswith("DecoderLayerPipe")]
    parts = ([f"{layers} dense decoder layer(s)" if moe else f"{layers} decoder layer(s)"] if layers else [])
    parts += ([f"{moe} MoE decoder layer(s)"] if moe else []) + others
    return " + ".join(parts) if parts else "nothing"

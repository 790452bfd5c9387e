"""Which pipeline rank holds which layer: the model cut into pp x vpp virtual stages (chunks), and the one split
ZeRO-1 cannot run.

The model's layers, in pipeline order: embedding (0), decoder layers 1..L, final norm (L+1), output head (L+2; a tied
head is a copy of the embedding, recipes.model.layers). They are cut into n = pp x vpp contiguous chunks, virtual
stages 0..n-1; pipeline rank r holds chunks r, r + pp, r + 2 pp, ... (the looped placement of interleaved 1F1B:
Narayanan et al. 2021, and torch.distributed.pipelining's multi-stage schedules). `parallel.pipeline_partition`:

- "uniform" (default): the decoder layers split as evenly as possible over the n chunks; the embedding joins the
  first chunk, the final norm and head the last. Where L does not divide evenly, the extra layers go to the middle
  chunks first: the first and last chunks also carry the embedding and the output head with the loss (Llama 3 took
  one layer off each for the same reason). The busiest chunk holds ceil(L / n) decoder layers, what the planner
  models.
- "parameters": the specs balanced by parameter count over the n chunks (DeepSpeed's partition_balanced). With a large
  vocabulary and few layers this can give the embedding or the head a chunk of its own.

Why a rank without a decoder layer matters: each rank's optimizer puts matrices (weight decay) and norms/biases (no
decay) in separate param groups, and DeepSpeed drops a group that is empty on that rank. ZeRO-1 then all-reduces the
gradient norm once per group over the model-parallel (TP x PP) group, so ranks with different group counts issue
different numbers of collectives and the job hangs in the first optimizer step (DeepSpeed issue #1522). We refuse
such a split before start (validation) and again at engine build time.
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
    "MTPLayerPipe": frozenset({"decay", "no_decay"}),  # model.mtp's prediction depths (recipes.model.mtp)
    "MoEMTPLayerPipe": frozenset({"decay", "no_decay", "experts"}),
}


UNEVEN_GROUPS_FIX = ("DeepSpeed's ZeRO-1 would hang in the first optimizer step (it all-reduces the gradient norm "
                     "once per group across stages). Use parallel.pipeline_partition=uniform (every stage gets "
                     "decoder layers) or parallel.zero_stage=0")


def layer_names(model_cfg) -> list[str]:
    """The spec type names in pipeline order (a tied head is an EmbeddingPipe, as in recipes.model.layers.layer_specs)."""
    head = "EmbeddingPipe" if model_cfg.tied_embeddings else "OutputHeadPipe"
    decoders = ["MoEDecoderLayerPipe" if model_cfg.is_moe_layer(i) else "DecoderLayerPipe"
                for i in range(model_cfg.num_layers)]
    depths = ["MoEMTPLayerPipe" if model_cfg.mtp_is_moe else "MTPLayerPipe"] * model_cfg.mtp_depths
    return ["EmbeddingPipe"] + decoders + ["FinalNormPipe", head] + depths


def layer_weights(model_cfg, tp: int, partition: str, ep: int = 1) -> list[float]:
    """What a partition balances: per-spec trainable parameters on one TP (and EP) rank, or 1 per decoder layer."""
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
    depth_extra = 2 * h * h / tp + 3 * norm_params(model_cfg)  # eh_proj, enorm, hnorm, final_layernorm
    count["MTPLayerPipe"] = count["DecoderLayerPipe"] + depth_extra
    count["MoEMTPLayerPipe"] = count.get("MoEDecoderLayerPipe", 0.0) + depth_extra
    return [count[n] for n in names]


def chunk_boundaries(model_cfg, tp: int, chunks: int, partition: str, ep: int = 1) -> list[int]:
    """The split into `chunks` virtual stages: chunk c holds specs [parts[c], parts[c + 1]). model.mtp's depths
    stay in the last chunk with the final norm and the head (they need the hidden state before the norm)."""
    if partition == "parameters":
        weights = layer_weights(model_cfg, tp, partition, ep)
        if not model_cfg.mtp_depths:
            return balanced_split(weights, chunks)
        end = model_cfg.num_layers + 1  # the final norm: it, the head and the depths weigh as one spec
        parts = balanced_split(weights[:end] + [sum(weights[end:])], chunks)
        return parts[:-1] + [len(weights)]
    L = model_cfg.num_layers
    if chunks > L:  # refused by validation (every chunk needs a decoder layer); some chunks stay empty
        return balanced_split(layer_weights(model_cfg, tp, partition, ep), chunks)
    counts = [L // chunks] * chunks
    for c in _extras_order(chunks)[:L % chunks]:
        counts[c] += 1
    parts, at = [0], 1
    for c in range(chunks - 1):
        at += counts[c]
        parts.append(at)
    return parts + [len(layer_names(model_cfg))]


def _extras_order(chunks: int) -> list[int]:
    """Where the decoder layers that do not divide evenly go: the middle chunks first, then the first (an embedding
    lookup is cheap), then the last (the output head and the loss)."""
    return list(range(1, chunks - 1)) + [0, chunks - 1][:chunks]


def stage_boundaries(model_cfg, tp: int, pp: int, partition: str, ep: int = 1) -> list[int]:
    """One chunk per pipeline rank (vpp = 1): stage s holds specs [parts[s], parts[s + 1])."""
    return chunk_boundaries(model_cfg, tp, pp, partition, ep)


def virtual_stages(pp_rank: int, pp: int, vpp: int) -> list[int]:
    """The chunks a pipeline rank holds, in the order it runs them: r, r + pp, r + 2 pp, ..."""
    return [pp_rank + c * pp for c in range(vpp)]


def chunk_layers(model_cfg, tp: int, pp: int, vpp: int, partition: str, ep: int = 1) -> list[list[int]]:
    """Layer indices of each of the pp x vpp virtual stages, in pipeline order."""
    parts = chunk_boundaries(model_cfg, tp, pp * vpp, partition, ep)
    return [list(range(a, b)) for a, b in zip(parts, parts[1:])]


def rank_layers(model_cfg, tp: int, pp: int, vpp: int, partition: str, ep: int = 1) -> list[list[int]]:
    """Spec indices each pipeline rank holds (all its chunks), per rank."""
    chunks = chunk_layers(model_cfg, tp, pp, vpp, partition, ep)
    return [sorted(i for c in virtual_stages(r, pp, vpp) for i in chunks[c]) for r in range(pp)]


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


def uneven_group_problem(names: list[str], held: list[list[int]], ep: int = 1) -> str | None:
    """None when every pipeline rank's optimizer has the same number of param groups, else what is wrong, per rank.
    `held`: the spec indices of each rank (rank_layers)."""
    per_rank = []
    for r, indices in enumerate(held):
        specs = [names[i] for i in indices]
        groups = frozenset().union(*(_groups(n, ep) for n in specs)) if specs else frozenset()
        per_rank.append((r, specs, groups))
    if len({len(g) for _, _, g in per_rank}) <= 1:
        return None
    lines = [f"stage {r}: {_describe(specs)} -> {len(g)} optimizer param group(s)" for r, specs, g in per_rank]
    return "; ".join(lines)


def _describe(held: list[str]) -> str:
    layers, moe = held.count("DecoderLayerPipe"), held.count("MoEDecoderLayerPipe")
    others = [n for n in held if not n.endswith("DecoderLayerPipe")]
    parts = ([f"{layers} dense decoder layer(s)" if moe else f"{layers} decoder layer(s)"] if layers else [])
    parts += ([f"{moe} MoE decoder layer(s)"] if moe else []) + others
    return " + ".join(parts) if parts else "nothing"

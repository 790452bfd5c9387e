"""The search over layouts: every valid combination of TP, CP, PP (and its schedule), DP, EP, ZeRO stage,
micro-batch and recompute for a cluster, priced by `recipes.planner.cost.estimate` and ranked."""
from __future__ import annotations

from dataclasses import replace

from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.cost import MEMORY_VERDICTS, Estimate, effective_layout, estimate
from recipes.planner.experts import expert_degrees
from recipes.planner.memory import device_memory, format_memory
from recipes.planner.pipeline import schedule_options


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


CP_SEARCH_FROM = 8192  # sequence length from which the search tries context parallelism
CP_MIN_TOKENS = 2048  # the search stops splitting a sequence below this many tokens per CP rank (thin GEMMs)


def cp_degrees(model_cfg, ranks: int) -> list[int]:
    """CP degrees the search tries with `ranks` GPUs left for CP x PP x DP: 1 below CP_SEARCH_FROM tokens; from there
    every divisor that splits the sequence into 2 x cp equal chunks of at least CP_MIN_TOKENS / 2 tokens."""
    s = model_cfg.seq_length
    if s < CP_SEARCH_FROM:
        return [1]
    return [c for c in _divisors(ranks) if s % (2 * c) == 0 and s // c >= CP_MIN_TOKENS]


def candidate_layouts(model_cfg, cluster, global_batch: int, assume: Assumptions = Assumptions()) -> list[Layout]:
    """Every layout worth pricing: TP within a node, CP from 8K tokens (`cp_degrees`), any PP that divides the rest
    with the schedules of `pipeline.schedule_options`, EP for a MoE model (every degree dividing the experts and
    DP x CP, inside a node or across), ZeRO 0-3 (2/3 only without PP), power-of-two micro-batches, the recompute modes
    that differ (selective only without flash attention), SP whenever TP > 1 (the same volume as TP's all-reduces,
    less memory)."""
    world = cluster.world_size
    out = []
    for t in _divisors(cluster.gpus_per_node):
        if world % t:
            continue
        for c in cp_degrees(model_cfg, world // t):
            for p in _divisors(world // (t * c)):
                if p > model_cfg.num_layers:
                    break
                out += _layouts_at(model_cfg, global_batch, t, c, p, world // (t * c * p), assume)
    return out


def _layouts_at(model_cfg, global_batch: int, t: int, c: int, p: int, dp: int, assume: Assumptions) -> list[Layout]:
    """The valid layouts with these degrees: EP (a MoE model: `expert_degrees`), ZeRO stages, pipeline schedules,
    micro-batches and recompute modes."""
    out = []
    stages = (0, 1, 2, 3) if p == 1 else (0, 1)
    for e, z in ((e, z) for e in expert_degrees(model_cfg, dp * c) for z in stages):
        b = 1
        while b <= min(assume.max_micro_batch, global_batch // dp):
            for r in ("none", "selective", "full"):
                lay = Layout(tp=t, cp=c, pp=p, dp=dp, zero_stage=z, micro_batch=b, sequence_parallel=t > 1,
                             recompute=r, ep=e)
                if effective_layout(lay, assume) != lay:
                    continue  # runs as another candidate: listing it would show the same layout twice
                # `schedule_options` gives only (schedule, vpp) pairs the schedule rules allow at this PP; the one
                # other rule that reads them (whole rounds of pp micro-batches) is `_whole_rounds`: the layout's
                # problems are asked once, not once per schedule
                if not lay.problems(model_cfg, global_batch):
                    out += [replace(lay, schedule=sched, vpp=v) for sched, v in schedule_options(model_cfg, p)
                            if _whole_rounds(sched, p, global_batch // (b * dp))]
            b *= 2
    return out


def _whole_rounds(schedule: str, pp: int, m: int) -> bool:
    """Whether `m` micro-batches make whole rounds of the schedule (Layout.problems' rule: every schedule but 1F1B
    runs them in rounds of pp)."""
    return schedule == "1f1b" or pp == 1 or m % max(1, m // pp) == 0


def _rank_key(e: Estimate):
    return (MEMORY_VERDICTS.index(e.memory_verdict), -e.tokens_per_s, e.memory_gib["total"])


def plan_layouts(model_cfg, cluster, global_batch: int, *, precision: str = "bf16", train_tokens: float | None = None,
                 assume: Assumptions = Assumptions()) -> list[Estimate]:
    """All candidate layouts priced and ranked: layouts that fit with the headroom first, then tight ones, then those
    that fit only under the lean activation count, then those over the device's memory; fastest first within each.
    A layout that differs from an earlier candidate only in a setting that changes nothing here (e.g. ZeRO-2 vs
    ZeRO-1 at DP=1: the same memory and time) is listed once, as the simpler one."""
    ests, seen = [], set()
    for lay in candidate_layouts(model_cfg, cluster, global_batch, assume):
        e = estimate(model_cfg, cluster, lay, global_batch, precision=precision, train_tokens=train_tokens,
                     assume=assume)
        key = _same_cost_key(e)
        if key not in seen:
            seen.add(key)
            ests.append(e)
    ests.sort(key=_rank_key)
    return ests


def listed_rank(est: Estimate, ests: list[Estimate]) -> int | None:
    """1-based rank of `est` in a `plan_layouts` list, also when it is listed as its same-cost twin (a recipe's
    ZeRO-2 at DP=1 is listed as ZeRO-1, its selective recompute under flash attention as none)."""
    key = _same_cost_key(est)
    return next((i for i, e in enumerate(ests, 1) if _same_cost_key(e) == key), None)


def _same_cost_key(e: Estimate) -> tuple:
    """Degrees and micro-batch plus every priced figure: equal keys = the same layout priced twice."""
    lay = e.layout
    figures = sorted(e.memory_gib.items()) + sorted(e.time_s.items())
    return (lay.tp, lay.cp, lay.ep, lay.pp, lay.dp, lay.micro_batch, lay.sequence_parallel,
            tuple((k, round(v, 9)) for k, v in figures))


def what_would_fit(model_cfg, cluster, global_batch: int, *, precision: str = "bf16",
                   assume: Assumptions = Assumptions(), max_nodes: int = 4096) -> str:
    """A sentence telling the user what would make some layout fit: more nodes, or a bigger GPU."""
    ests = plan_layouts(model_cfg, cluster, global_batch, precision=precision, assume=assume)
    if not ests:
        return (f"tp must divide the heads ({model_cfg.num_attention_heads}), the query groups "
                f"({model_cfg.query_groups}) and gpus_per_node ({cluster.gpus_per_node}); pp <= layers "
                f"({model_cfg.num_layers}); and global batch {global_batch} must be a multiple of micro-batch x dp "
                f"with tp x pp x dp = {cluster.world_size}: pick a global batch that is a multiple of the GPU count")
    smallest = min(ests, key=lambda e: e.memory_gib["total"])
    # the stages actually searched: a MoE model never gets ZeRO-3 (refused with experts), a pipeline never ZeRO-2/3
    tried = f"ZeRO-{max(e.layout.zero_stage for e in ests)}, full recompute, micro-batch 1" + (
        f" and CP up to {max(e.layout.cp for e in ests)}" if model_cfg.seq_length >= CP_SEARCH_FROM else "")
    msg = (f"the leanest layout searched ({smallest.layout.describe()}; {tried} were all tried) needs "
           f"{smallest.memory_gib['total']:.1f} GiB per GPU "
           f"({format_memory(smallest.memory_gib)}; {smallest.memory_gib['total_lean']:.1f} GiB under the lean "
           f"activation count) but each {cluster.gpu} has {device_memory(cluster)}")
    nodes = cluster.nodes
    while nodes < max_nodes:
        nodes *= 2
        bigger = cluster.model_copy(update={"nodes": nodes})
        if any(e.fits for e in plan_layouts(model_cfg, bigger, global_batch, precision=precision, assume=assume)[:1]):
            msg += f"; with {nodes} nodes ({nodes * cluster.gpus_per_node} GPUs) a layout fits"
            break
    return msg

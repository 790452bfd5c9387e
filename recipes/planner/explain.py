"""Why the planner recommends a layout, in sentences computed from the priced layouts.

Every sentence is a small function of the plan (`Plan`) that returns its text, or None where it does not apply, so
each can be tested where it must appear and where it must not. A comparison between two layouts names as its cause
the largest term of their step-time difference (`StepTerms.minus`), never a fixed culprit; a statement about memory
is made only about layouts whose memory was priced.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

from recipes.model.shape import count_parameters
from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.cost import Estimate, device_memory, estimate, format_memory
from recipes.planner.search import CP_SEARCH_FROM, candidate_layouts
from recipes.planner.experts import ep_members_per_node, expert_degrees, load_imbalance, stage_parameters
from recipes.planner.links import nvlink_vs_nic
from recipes.planner.pipeline import SCHEDULES, in_flight, schedule_options, schedule_words
from recipes.planner.units import count, format_duration, human_params

IMBALANCE_DEFAULT = ("the default: published MoE throughput is measured with the tokens force-balanced, "
                     "Megatron-Bridge's performance summary; `plan --from-run RUN_DIR` takes a run's measured figure")
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal tokens per parameter
NEAR_BEST = 0.02  # layouts within 2% of the fastest are "as fast"; among them the simplest is recommended


@dataclass
class Plan:
    """What the sentences read: the recipe, every priced layout (ranked), the recommended one, the budget."""
    recipe: object
    ests: list[Estimate]
    rec: Estimate
    tokens: float | None = None
    corpus: dict | None = None
    max_days: float = 90.0
    assume: Assumptions = Assumptions()
    calibration: object = None  # recipes.planner.calibration.Calibration applied, or None
    imbalance_source: str = IMBALANCE_DEFAULT  # where assume.moe_load_imbalance comes from

    @property
    def model(self):
        return self.recipe.model

    @property
    def cluster(self):
        return self.recipe.cluster


# ---------------------------------------------------------------------------------------------------------------------
# Recommendation
# ---------------------------------------------------------------------------------------------------------------------

_SIMPLER = ("no model parallelism", "no context parallelism (a collective per layer on the critical path)",
            "no ZeRO-3 (whose weight gathers every micro-batch are the least certain overlap in the model)",
            "less model parallelism", "less context parallelism", "fewer pipeline stages", "a lower ZeRO stage",
            "less recompute", "a simpler pipeline schedule (1F1B, then interleaved 1F1B, then zero-bubble)",
            "fewer model chunks per pipeline rank")


def complexity(e: Estimate) -> tuple:
    """Sort key of simplicity, in the order of `_SIMPLER`: no model parallelism first, then no CP, no ZeRO-3, the
    least TP x PP, the least CP, the fewest stages, the lowest ZeRO stage, the least recompute, the simplest
    pipeline schedule, the fewest chunks per rank."""
    lay = e.layout
    return (lay.model_parallel_size > 1, lay.cp > 1, lay.zero_stage == 3, lay.model_parallel_size, lay.cp, lay.pp,
            lay.zero_stage, ("none", "selective", "full").index(lay.recompute), SCHEDULES.index(lay.schedule),
            lay.vpp, -e.tokens_per_s)


def pure_data_parallel(lay: Layout) -> bool:
    """No layer split (TP = PP = 1) and no sequence split (CP = 1): every GPU runs the whole model on whole
    sequences."""
    return lay.model_parallel_size == 1 and lay.cp == 1


def _data_axis(lay: Layout) -> str:
    """'DP=8', or 'DP x CP = 4 x 2 = 8 ranks' (DeepSpeed's data axis: gradients and ZeRO over both)."""
    if lay.cp == 1:
        return f"DP={lay.dp}"
    return f"DP x CP = {lay.dp} x {lay.cp} = {lay.data_axis} ranks"


def recommend(ests: list[Estimate]) -> Estimate | None:
    """The simplest layout (see `complexity`) among those within 2% of the fastest that fit with the memory headroom;
    when none does, the same among the tight ones, then among those that fit only under the lean activation count
    (the explanation says so)."""
    for verdict in ("fits", "tight", "maybe"):
        pool = [e for e in ests if e.memory_verdict == verdict]
        if pool:
            best = max(e.tokens_per_s for e in pool)
            return min((e for e in pool if e.tokens_per_s >= best * (1 - NEAR_BEST)), key=complexity)
    return None


def simpler_because(a: Estimate, b: Estimate) -> str:
    """Why the simpler of two layouts is simpler: the first rule of `complexity` that tells them apart."""
    ka, kb = complexity(a), complexity(b)
    i = next((i for i in range(len(_SIMPLER)) if ka[i] != kb[i]), None)
    if i is None:
        return "the same complexity; the faster one"
    simple = a if ka[i] < kb[i] else b
    return f"{simple.layout.describe()} has {_SIMPLER[i]}"


def best_fitting(ests: list[Estimate], pred: Callable[[Layout], bool]) -> Estimate | None:
    """The fastest layout matching `pred` that fits with the headroom."""
    return max((e for e in ests if e.fits_with_headroom and pred(e.layout)), key=lambda e: e.tokens_per_s,
               default=None)


# ---------------------------------------------------------------------------------------------------------------------
# Comparing two layouts: the cause is the largest term of the difference
# ---------------------------------------------------------------------------------------------------------------------

def _compute_words(x: Estimate, r: Estimate, model_cfg) -> str:
    parts = []
    if abs(x.compute_efficiency - r.compute_efficiency) > 1e-3:
        why = []
        if x.layout.micro_batch != r.layout.micro_batch:
            why.append(f"micro-batch {x.layout.micro_batch} against {r.layout.micro_batch}")
        if x.layout.tp != r.layout.tp:
            why.append(f"a hidden slice of {model_cfg.hidden_size // x.layout.tp} per GPU against "
                       f"{model_cfg.hidden_size // r.layout.tp}")
        parts.append(f"its GEMMs run at {x.compute_efficiency:.0%} of peak against {r.compute_efficiency:.0%}"
                     + (f" ({', '.join(why)})" if why else ""))
    L = model_cfg.num_layers
    slow_x, slow_r = -(-L // x.layout.pp), -(-L // r.layout.pp)
    if slow_x * r.layout.pp != slow_r * x.layout.pp:
        parts.append(f"its slowest pipeline stage holds {slow_x} of {L} layers")
    return "compute" + (f": {'; '.join(parts)}" if parts else "")


def bubble_words(e: Estimate) -> str:
    """'1F1B: bubble (p-1)/m = 4/128 = 3.1%': the schedule's bubble as a share of the compute (above 100% when m is
    below p - 1), by its own formula (recipes.planner.pipeline)."""
    return schedule_words(e.layout, e.micro_batches, e.bubble_fraction)


def term_words(term: str, x: Estimate, r: Estimate, model_cfg) -> str:
    """What a step-time term of layout `x` is, in words, for a comparison with `r`."""
    lay = x.layout
    if term == "compute":
        return _compute_words(x, r, model_cfg)
    if term == "recompute":
        return f"recompute={lay.recompute}, which runs every layer's forward again in the backward"
    if term == "tp_comm":
        n = 4 + 2 * (lay.recompute == "full")
        if lay.sequence_parallel:
            return (f"TP={lay.tp}'s all-gathers and reduce-scatters (SP: {n} of each per layer per micro-batch, not "
                    "overlapped)")
        return f"TP={lay.tp}'s all-reduces ({n} per layer per micro-batch, not overlapped)"
    if term == "cp_comm":
        return (f"CP={lay.cp}'s all-gather of K and V and reduce-scatter of their gradients (every layer, every "
                "micro-batch, not overlapped)")
    if term == "ep_comm":
        return f"EP={lay.ep}'s dispatch and combine all-to-alls (4 per MoE layer per micro-batch, not overlapped)"
    if term == "imbalance":
        return "waiting for the busiest EP rank's extra routed tokens (the assumed load imbalance)"
    if term == "bubble":
        return f"the pipeline bubble (PP={lay.pp}, {bubble_words(x)})"
    if term == "pp_comm":
        return f"stage-to-stage sends (PP={lay.pp}" + (f", {lay.vpp} chunks per rank: {lay.vpp}x the sends)"
                                                       if lay.vpp > 1 else ")")
    if term == "overhead":
        return "the fixed per-step overhead (optimizer, data, logging; calibrated)"
    if lay.zero_stage == 3:
        return (f"ZeRO-3's weight all-gathers and gradient reduce-scatters over {_data_axis(lay)}, module by module "
                "every micro-batch, that the compute does not hide")
    if lay.zero_stage == 2:
        return f"the ZeRO-2 gradient traffic over {_data_axis(lay)} that the backward does not hide"
    return f"the gradient all-reduce over {_data_axis(lay)} after the last micro-batch (not overlapped)"


def compare(x: Estimate, r: Estimate, model_cfg, what: str = "the recommended layout") -> str:
    """'runs at 85% of the recommended layout's throughput: the largest part of the difference is ...' — or, when
    `x` is within NEAR_BEST of `r`, why `r` was preferred."""
    ratio = x.tokens_per_s / r.tokens_per_s
    if ratio >= 1 - NEAR_BEST:
        return (f"runs at {ratio:.0%} of {what}'s throughput: within {NEAR_BEST:.0%}, where the simpler layout is "
                f"recommended ({simpler_because(x, r)})")
    diff = x.terms.minus(r.terms)
    term = max(diff, key=diff.get)
    total = x.terms.step - r.terms.step
    net = "" if abs(total - diff[term]) < 0.005 else f"; {total:+.2f} s per step in all"
    return (f"runs at {ratio:.0%} of {what}'s throughput: the largest term it adds is "
            f"{term_words(term, x, r, model_cfg)} (+{diff[term]:.2f} s per step{net})")


# ---------------------------------------------------------------------------------------------------------------------
# The sentences
# ---------------------------------------------------------------------------------------------------------------------

def model_states(plan: Plan) -> str:
    params = count_parameters(plan.model)
    states = 16 * params / 2**30
    c = plan.cluster
    side = "more than" if states > plan.rec.gpu_memory_gib else "within"
    return (f"The model has {human_params(params)} parameters; Adam with mixed precision (or fp32) needs 16 bytes "
            f"each = {states:,.1f} GiB of model states, {side} one {c.gpu}'s {device_memory(c)}.")


_SHARDS = {0: "nothing (every GPU keeps all 16 bytes per parameter)", 1: "the optimizer states",
           2: "the optimizer states and gradients", 3: "parameters, gradients and optimizer states"}


def data_parallel_wins(plan: Plan) -> Optional[str]:
    rec = plan.rec
    lay = rec.layout
    if not pure_data_parallel(lay):
        return None
    if lay.dp == 1:
        return ("One GPU: nothing is split or communicated; the weights, gradients, optimizer states and activations "
                "all sit on it.")
    why = (f"Plain data parallelism wins: no layer is split, so there is no tensor-parallel all-reduce and no pipeline "
           f"bubble; ZeRO-{lay.zero_stage} shards {_SHARDS[lay.zero_stage]} over {lay.dp} ranks.")
    lower = best_fitting(plan.ests, lambda l: pure_data_parallel(l) and l.zero_stage < lay.zero_stage)
    if lower is not None:
        return why + f" The best lower ZeRO stage ({lower.layout.describe()}) {compare(lower, rec, plan.model)}."
    priced = [e for e in plan.ests if pure_data_parallel(e.layout) and e.layout.zero_stage < lay.zero_stage]
    if priced:
        lean = min(priced, key=lambda e: e.memory_gib["total"])
        why += (f" Lower ZeRO stages do not fit: the leanest ({lean.layout.describe()}) needs "
                f"{lean.memory_gib['total']:.1f} GiB, over the {rec.memory_budget_gib:.1f} GiB budget.")
    return why


def _unpriced_data_parallel(plan: Plan) -> str:
    """TP=PP=1 was never priced: say which rule skipped it and what the smallest admissible batch would give."""
    c, m, batch = plan.cluster, plan.model, plan.recipe.training.global_batch
    world = c.world_size
    rule = Layout(tp=1, pp=1, dp=world, zero_stage=3).problems(m, batch)
    why = "; ".join(p.message for p in rule) or f"no micro-batch <= {plan.assume.max_micro_batch} divides it"
    admit = -(-batch // world) * world
    text = f"TP=PP=1 (DP={world}) was not priced: {why}."
    ests = [estimate(m, c, lay, admit, precision=plan.recipe.training.precision, assume=plan.assume)
            for lay in candidate_layouts(m, c, admit, plan.assume) if _no_model_parallel(lay)]
    best = best_fitting(ests, lambda l: True)
    if best is not None:
        return text + (f" At global batch {admit} it would fit: {best.layout.describe()} needs "
                       f"{best.memory_gib['total']:.1f} GiB per GPU at {best.tokens_per_s:,.0f} tokens/s.")
    if ests:
        lean = min(ests, key=lambda e: e.memory_gib["total"])
        return text + (f" At global batch {admit} it would not fit either: the leanest ({lean.layout.describe()}) "
                       f"needs {lean.memory_gib['total']:.1f} GiB, over the {lean.memory_budget_gib:.1f} GiB budget.")
    return text


def _no_model_parallel(lay: Layout) -> bool:
    return lay.model_parallel_size == 1  # TP = PP = 1; CP (a split of the sequence, not of the model) allowed


def why_model_parallel(plan: Plan) -> Optional[str]:
    rec = plan.rec
    if rec.layout.model_parallel_size == 1:
        return None  # (CP alone is explained by `context_parallel`)
    no_mp = [e for e in plan.ests if _no_model_parallel(e.layout)]
    if not no_mp:
        return _unpriced_data_parallel(plan)
    fitting = [e for e in no_mp if e.fits_with_headroom]
    if not fitting:
        lean = min(no_mp, key=lambda e: e.memory_gib["total"])
        cp = max(e.layout.cp for e in no_mp)
        tried = "ZeRO stages, micro-batches and recompute" + (f", CP up to {cp}" if cp > 1 else "")
        return (f"Model parallelism is forced by memory: all {len(no_mp)} TP=PP=1 layouts priced ({tried}) exceed "
                f"the {rec.memory_budget_gib:.1f} GiB budget; the leanest ({lean.layout.describe()}) needs "
                f"{lean.memory_gib['total']:.1f} GiB ({format_memory(lean.memory_gib)}).")
    plain = best_fitting(plan.ests, lambda l: _no_model_parallel(l) and l.zero_stage < 3)
    if plain is None:
        lean = min((e for e in no_mp if e.layout.zero_stage < 3), key=lambda e: e.memory_gib["total"])
        z3 = best_fitting(plan.ests, _no_model_parallel)
        return (f"Without ZeRO-3, TP=PP=1 does not fit: the leanest ({lean.layout.describe()}) needs "
                f"{lean.memory_gib['total']:.1f} GiB, over the {rec.memory_budget_gib:.1f} GiB budget; ZeRO-3 over "
                f"all {plan.cluster.world_size} GPUs fits ({z3.layout.describe()}, {z3.memory_gib['total']:.1f} GiB) "
                f"but {compare(z3, rec, plan.model)}.")
    kind = "pure data-parallel layout" if plain.layout.cp == 1 else "layout without model parallelism"
    return f"The best {kind} ({plain.layout.describe()}) fits but {compare(plain, rec, plan.model)}."


def simplest_near_fastest(plan: Plan) -> Optional[str]:
    """When a faster layout exists within NEAR_BEST, say so and why the recommended one was preferred."""
    rec = plan.rec
    fastest = best_fitting(plan.ests, lambda l: True) if rec.fits_with_headroom else max(
        (e for e in plan.ests if e.fits), key=lambda e: e.tokens_per_s)
    if fastest is None or fastest is rec or fastest.tokens_per_s <= rec.tokens_per_s:
        return None
    return (f"The fastest layout that fits ({fastest.layout.describe()}) is {fastest.tokens_per_s / rec.tokens_per_s - 1:.1%} "
            f"faster: within {NEAR_BEST:.0%}, so the simpler one is recommended ({simpler_because(rec, fastest)}).")


def tensor_parallel(plan: Plan) -> Optional[str]:
    rec, c = plan.rec, plan.cluster
    if rec.layout.tp <= 1:
        return None
    t = rec.time_s
    inside = rec.layout.tp <= c.gpus_per_node
    where = (f"stays inside a node (at most {c.gpus_per_node} GPUs on NVLink)" if inside
             else "crosses nodes (more than one node's GPUs)")
    what = "all-gathers and reduce-scatters (SP)" if rec.layout.sequence_parallel else "all-reduces"
    nvlink, nic = nvlink_vs_nic(c, plan.assume)
    return (f"TP={rec.layout.tp} {where}: its {what} cost {t['tp_comm']:.2f} s per step "
            f"({t['tp_comm'] / t['step']:.0%})" + (
                f"; over InfiniBand they would get ~{nic:.0f} GB/s of bus bandwidth per GPU (its share of the "
                f"node's {c.inter_node_gbps:g} GB/s of NICs, one direction) instead of NVLink's ~{nvlink:.0f} (the "
                f"{c.intra_node_gbps:g} GB/s datasheet figure counts both directions; both as priced)."
                if inside else "."))


def pipeline(plan: Plan) -> Optional[str]:
    """PP > 1: the schedule chosen and its priced terms (bubble, sends, activations in flight), against the other
    schedules at the same degrees, each compared by the terms it changes."""
    rec = plan.rec
    lay = rec.layout
    if lay.pp <= 1:
        return None
    t = rec.time_s
    text = (f"PP={lay.pp} splits the layers into stages; with {rec.micro_batches} micro-batches per step the "
            f"bubble costs {t['bubble']:.2f} s ({bubble_words(rec)}), stage-to-stage sends {t['pp_comm']:.2f} s, and "
            f"the first stage holds {in_flight(lay, rec.micro_batches):.3g} micro-batches of activations "
            f"({rec.memory_gib['activations']:.1f} GiB).")
    others = [_schedule_twin_words(plan, sched, v) for sched, v in schedule_options(plan.model, lay.pp)
              if (sched, v) != (lay.schedule, lay.vpp)]
    others = [o for o in others if o]
    return text + (" Other schedules here: " + "; ".join(others) + "." if others else "")


def _schedule_name(lay: Layout) -> str:
    if lay.schedule == "interleaved_1f1b":
        return f"interleaved 1F1B ({lay.vpp} chunks per rank)"
    if lay.schedule == "zero_bubble":
        return "zero-bubble" + (f" ({lay.vpp} chunks per rank)" if lay.vpp > 1 else "")
    return "1F1B"


def _schedule_twin_words(plan: Plan, schedule: str, vpp: int) -> Optional[str]:
    """The recommended layout under another schedule: its bubble, sends and memory against the recommendation's."""
    rec, batch = plan.rec, plan.recipe.training.global_batch
    twin = replace(rec.layout, schedule=schedule, vpp=vpp)
    if twin.problems(plan.model, batch):
        return None
    e = estimate(plan.model, plan.cluster, twin, batch, precision=plan.recipe.training.precision, assume=plan.assume)
    d = e.terms.minus(rec.terms)
    mem = (f"{e.memory_gib['total']:.1f} GiB" + ("" if e.fits_with_headroom else
                                                 f", over the {rec.memory_budget_gib:.1f} GiB budget"))
    return (f"{_schedule_name(twin)} {e.tokens_per_s / rec.tokens_per_s:.0%} of the throughput (bubble "
            f"{d['bubble']:+.2f} s, sends {d['pp_comm']:+.2f} s; {mem})")


def context_parallel(plan: Plan) -> Optional[str]:
    """From CP_SEARCH_FROM tokens, where CP was searched: why the recommendation uses CP (what it costs, and whether it
    is what makes a layout fit), or why it does not."""
    rec, m = plan.rec, plan.model
    s, lay = m.seq_length, rec.layout
    if s < CP_SEARCH_FROM:
        return None
    if lay.cp == 1:
        best = best_fitting(plan.ests, lambda l: l.cp > 1)
        if best is None:
            return f"Context parallelism was searched ({s:,}-token sequences); no CP layout fits with the headroom."
        return (f"Context parallelism was searched ({s:,}-token sequences) and not chosen: the best CP layout "
                f"({best.layout.describe()}) {compare(best, rec, m)}.")
    t = rec.time_s
    again = ", again in the recompute forward" if lay.recompute == "full" else ""
    text = (f"CP={lay.cp} splits each {s:,}-token sequence into {2 * lay.cp} chunks, two per GPU ({s // lay.cp:,} "
            f"tokens each, load-balanced under the causal mask): it divides the activations and the attention work "
            f"by {lay.cp}; per layer it all-gathers K and V (forward{again}) and reduce-scatters their gradients "
            f"(backward), {t['cp_comm']:.2f} s per step ({t['cp_comm'] / t['step']:.0%}), not overlapped with "
            f"compute.")
    return text + " " + _without_cp(plan)


def _without_cp(plan: Plan) -> str:
    """Whether CP is what makes the recommended layout fit, and what the best layout without CP gives."""
    rec, m, c = plan.rec, plan.model, plan.cluster
    lay, batch = rec.layout, plan.recipe.training.global_batch
    twin_layout = replace(lay, cp=1, dp=lay.dp * lay.cp)  # the same GPUs, CP's ranks given to DP
    twin = None
    if not twin_layout.problems(m, batch):
        twin = estimate(m, c, twin_layout, batch, precision=plan.recipe.training.precision, assume=plan.assume)
    no_cp = [e for e in plan.ests if e.layout.cp == 1]
    best = best_fitting(no_cp, lambda l: True)
    if twin is not None and not twin.fits_with_headroom:
        lean = (f" ({twin.memory_gib['total_lean']:.1f} GiB under the lean activation count, within the device: "
                "a stack that remakes element-wise outputs could run it)" if twin.memory_verdict == "maybe" else "")
        head = (f"CP is what makes this layout fit: without it ({twin_layout.describe()}) it would need "
                f"{twin.memory_gib['total']:.1f} GiB{lean}, over the {rec.memory_budget_gib:.1f} GiB budget; ")
    else:
        head = ""
    if best is None:
        lean = min(no_cp, key=lambda e: e.memory_gib["total"], default=None)
        tail = f"no layout without CP fits" + (
            f" (of {len(no_cp)} priced, the leanest, {lean.layout.describe()}, needs "
            f"{lean.memory_gib['total']:.1f} GiB: {format_memory(lean.memory_gib)})" if lean else "") + "."
    else:
        tail = f"the best layout without CP ({best.layout.describe()}) {compare(best, rec, m)}."
    text = head + tail
    return text[0].upper() + text[1:]


def expert_parallel(plan: Plan) -> Optional[str]:
    """A MoE model: what EP the recommendation uses, what its all-to-alls cost and where they run (inside a node or,
    the expensive case, across nodes), the load imbalance and where that figure comes from, the imbalance at which
    the choice would change, and why not the next lower or higher EP."""
    rec, m, c = plan.rec, plan.model, plan.cluster
    if m.moe is None:
        return None
    lay, t, E = rec.layout, rec.time_s, m.moe.num_experts
    experts = stage_parameters(m, lay.tp, lay.pp, lay.ep)[1]
    if lay.ep == 1:
        text = (f"No expert parallelism: every GPU holds all {E} experts of its stage's MoE layers "
                f"({human_params(experts)} expert parameters per GPU). The layouts with EP were priced with the "
                f"busiest EP rank at {plan.assume.moe_load_imbalance:g}x the mean routed tokens "
                f"({plan.imbalance_source}).")
    else:
        inside = ep_members_per_node(lay, c.gpus_per_node) >= lay.ep
        nvlink, nic = nvlink_vs_nic(c, plan.assume)
        where = ("inside a node, on NVLink" if inside else
                 f"across nodes, over InfiniBand: the expensive case, each GPU's share of its node's NICs is "
                 f"~{nic:.0f} GB/s against NVLink's {nvlink:.0f} (bus bandwidth, as priced)")
        imb = load_imbalance(m, lay.ep, plan.assume)
        text = (f"EP={lay.ep} gives each GPU {E // lay.ep} of the {E} experts of every MoE layer "
                f"({human_params(experts)} expert parameters per GPU instead of {lay.ep}x that); its dispatch and "
                f"combine all-to-alls (4 per MoE layer per micro-batch) run {where}, {t['ep_comm']:.2f} s per step "
                f"({t['ep_comm'] / t['step']:.0%}). Load imbalance: the busiest EP rank gets {imb:g}x the mean "
                f"routed tokens ({plan.imbalance_source}), {t['imbalance']:.2f} s per step.")
    flip = ep_break_even(plan)
    return text + (" " + flip if flip else "") + "".join(" " + w for w in _other_ep(plan) if w)


def _at_imbalance(plan: Plan, layouts: list[Layout], imbalance: float) -> float:
    """The best tokens/s among `layouts` if the busiest EP rank got `imbalance` x the mean routed tokens."""
    assume = replace(plan.assume, moe_load_imbalance=imbalance)
    return max(estimate(plan.model, plan.cluster, lay, plan.recipe.training.global_batch,
                        precision=plan.recipe.training.precision, assume=assume).tokens_per_s for lay in layouts)


def ep_break_even(plan: Plan, highest: float = 4.0, contenders: int = 5) -> Optional[str]:
    """The imbalance at which the layouts of the other kind (EP = 1 against EP > 1; the fastest few that fit, each
    re-priced) would overtake the recommendation's kind, found by bisection: the EP choice holds from the current
    figure up to (or down to) it."""
    rec = plan.rec
    uses_ep = rec.layout.ep > 1
    ranked = sorted((e for e in plan.ests if e.fits_with_headroom), key=lambda e: -e.tokens_per_s)
    mine = [e.layout for e in ranked if (e.layout.ep > 1) == uses_ep][:contenders]
    other = [e.layout for e in ranked if (e.layout.ep > 1) != uses_ep][:contenders]
    if not other or not mine:
        return None
    ahead = (lambda x: _at_imbalance(plan, mine, x) >= _at_imbalance(plan, other, x))
    kind = "layouts with EP" if uses_ep else "layouts without EP"
    rival = "the best layout without EP" if uses_ep else "the best layout with EP"
    lo, hi = 1.0, highest
    if uses_ep and ahead(hi):
        return f"The {kind} stay ahead of {rival} up to an imbalance of {hi:g}."
    if not uses_ep and ahead(lo):
        return f"The {kind} stay ahead even if the tokens were perfectly balanced (imbalance 1.0)."
    if uses_ep and not ahead(lo):
        return None
    for _ in range(25):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ahead(mid) == uses_ep else (lo, mid)
    if uses_ep:
        return f"The {kind} stay ahead of {rival} up to an imbalance of {lo:.2f}."
    return f"{rival[0].upper()}{rival[1:]} would win below an imbalance of {lo:.2f}."


def _other_ep(plan: Plan) -> list[Optional[str]]:
    """Why not the next lower EP (memory, or the step time) and why not the next higher one (the step time)."""
    rec, m = plan.rec, plan.model
    lay, batch = rec.layout, plan.recipe.training.global_batch
    degrees = expert_degrees(m, lay.data_axis)
    out = []
    for ep in (max((d for d in degrees if d < lay.ep), default=None), min((d for d in degrees if d > lay.ep),
                                                                          default=None)):
        # EP > 1 needs ZeRO-1 or 2 (DeepSpeed reduces the experts' gradients in its ZeRO optimizer only)
        twin = None if ep is None else replace(lay, ep=ep, zero_stage=max(lay.zero_stage, int(ep > 1)))
        if twin is None:
            continue
        problems = twin.problems(m, batch)
        if problems:
            out.append(f"{_twin_name(twin, lay)} cannot run here: {problems[0].message.split(' (')[0]}.")
            continue
        e = estimate(m, plan.cluster, twin, batch, precision=plan.recipe.training.precision, assume=plan.assume)
        if not e.fits_with_headroom:
            out.append(f"{_twin_name(twin, lay)} would need {e.memory_gib['total']:.1f} GiB per GPU, over the "
                       f"{rec.memory_budget_gib:.1f} GiB budget.")
        else:
            out.append(f"{_twin_name(twin, lay)} {compare(e, rec, m)}.")
    return out


def _twin_name(twin: Layout, lay: Layout) -> str:
    return f"EP={twin.ep}" + (f" (with ZeRO-{twin.zero_stage})" if twin.zero_stage != lay.zero_stage else "")


def data_parallel_traffic(plan: Plan) -> Optional[str]:
    rec = plan.rec
    lay = rec.layout
    if lay.data_axis <= 1:
        return None
    how = {0: "one gradient all-reduce after the last micro-batch",
           1: "a gradient reduce-scatter and parameter all-gather after the last micro-batch",
           2: "a gradient reduce-scatter every micro-batch (overlapped with its backward) and one all-gather",
           3: "weight all-gathers before every module's forward and backward and gradient reduce-scatters, every "
              "micro-batch, prefetched behind the compute"}[lay.zero_stage]
    return (f"{_data_axis(lay)}, ZeRO-{lay.zero_stage}: {how}; {rec.time_s['dp_comm']:.2f} s of it per step is not "
            f"hidden.")


def memory(plan: Plan) -> str:
    rec, c = plan.rec, plan.cluster
    b = rec.buffers_gib
    text = (f"Memory per GPU: {format_memory(rec.memory_gib)} of {device_memory(c)}, {verdict_words(rec, plan.assume)}. "
            f"Buffers: CUDA context {b['cuda_context']:.1f} + {rec.communicators} NCCL communicators "
            f"{b['communicators']:.1f} + DeepSpeed buckets {b['deepspeed_buckets']:.1f}"
            + (f" + gathered ZeRO-3 layers {b['zero3_gathered']:.1f}" if b["zero3_gathered"] else "") + " GiB.")
    if rec.layout.recompute != "none":
        plain = estimate(plan.model, c, replace(rec.layout, recompute="none"), plan.recipe.training.global_batch,
                         precision=plan.recipe.training.precision, assume=plan.assume)
        text += (f" Without recompute this layout would need {plain.memory_gib['total']:.1f} GiB"
                 + (" (over the budget)." if not plain.fits_with_headroom else " (it would fit, but run slower)."
                    if plain.tokens_per_s < rec.tokens_per_s else "."))
    return text


def verdict_words(e: Estimate, assume: Assumptions) -> str:
    """The memory verdict where it is stated, with what it rests on: Korthikanti's activation count is an upper bound
    (every tensor the layer saves); the lean count, what a stack that remakes element-wise outputs keeps, is the lower
    one. A total within 5% of the line it is judged at is called near the boundary."""
    mem, head = e.memory_gib, assume.memory_headroom
    near = " (near the boundary: within 5%)" if e.near_boundary else ""
    if e.memory_verdict == "fits":
        return f"within the {e.memory_budget_gib:.1f} GiB budget ({head:.0%} headroom){near}"
    if e.memory_verdict == "tight":
        return (f"TIGHT: above the {e.memory_budget_gib:.1f} GiB budget ({head:.0%} headroom){near}; expect to tune "
                "micro-batch or recompute on the cluster")
    lean = (f"{mem['total_lean']:.1f} GiB under the lean activation count (norm outputs and the activation function's "
            "output remade in the backward, as megatron-core's recompute_modules and torchtitan's op-level "
            "checkpointing do; this project's trainer keeps them)")
    if e.memory_verdict == "maybe":
        return (f"MAYBE, near the boundary: over the device under Korthikanti's activation count, an upper bound "
                f"(every tensor a layer saves), and within it at {lean}")
    return f"does NOT fit, even at {lean}{near}"


def step(plan: Plan) -> str:
    rec = plan.rec
    text = (f"Predicted step {rec.time_s['step']:.2f} s, {rec.tokens_per_s:,.0f} tokens/s, {rec.tflops_per_gpu:.0f} "
            f"model TFLOP/s per GPU = {rec.mfu:.0%} MFU.")
    if rec.layout.recompute != "none" or not plan.assume.flash_attention:
        text += f" With {_executed_why(plan)} the GPUs execute {rec.hardware_tflops_per_gpu:.0f} TFLOP/s."
    return text


def _executed_why(plan: Plan) -> str:
    """Why the executed FLOP/s differ from the model FLOP/s (model FLOPs: causal attention, no recompute)."""
    why = []
    if plan.rec.layout.recompute != "none":
        why.append(f"recompute={plan.rec.layout.recompute}")
    if not plan.assume.flash_attention:
        why.append("the whole s x s attention block computed, then masked")
    return " and ".join(why)


def duration(plan: Plan) -> Optional[str]:
    if not plan.tokens:
        return None
    rec = plan.rec
    seconds = plan.tokens / rec.tokens_per_s
    return (f"{plan.tokens:.3g} tokens take {format_duration(seconds)} on {plan.cluster.world_size} GPUs "
            f"({count(seconds / 3600 * plan.cluster.world_size)} GPU-hours).")


def corpus(plan: Plan) -> Optional[str]:
    c = plan.corpus
    if not c:
        return None
    rate = plan.rec.tokens_per_s
    in_window = rate * plan.max_days * 86400
    frac = in_window / c["tokens"]
    epoch = format_duration(c["tokens"] / rate)
    head = f"The corpus is {c['bytes']:.3g} bytes ~ {c['tokens']:.3g} tokens; "
    if frac < 1:
        return head + (f"in {plan.max_days:g} days one run trains on {in_window:.3g} tokens = {frac:.3%} of it (one "
                       f"pass over all of it would take {epoch}).")
    return head + (f"one pass takes {epoch}, so {plan.max_days:g} days would allow {frac:,.0f} passes: the data, not "
                   "the cluster, bounds this run.")


def compute_optimal(plan: Plan) -> str:
    optimal = CHINCHILLA_TOKENS_PER_PARAM * count_parameters(plan.model)
    return (f"Compute-optimal data for this size is ~{optimal:.3g} tokens (20 per parameter, Hoffmann et al. 2022): "
            f"{format_duration(optimal / plan.rec.tokens_per_s)} at this rate.")


SENTENCES: tuple[Callable[[Plan], Optional[str]], ...] = (
    model_states, data_parallel_wins, why_model_parallel, simplest_near_fastest, tensor_parallel, pipeline,
    context_parallel, expert_parallel, data_parallel_traffic, memory, step, duration, corpus, compute_optimal)


def explain(plan: Plan) -> list[str]:
    """Plain-language reasons for the recommendation, each backed by numbers from the plan."""
    return [s for s in (f(plan) for f in SENTENCES) if s]

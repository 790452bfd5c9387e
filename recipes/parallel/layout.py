"""The one object for the parallel layout, and the one place its rules live: `Layout.problems` / `resolve_layout`
return structured problems (field, what is wrong with the values, the fix) that validation, the planner, the launcher's
world-size check and the engine only format.

Rank order is TP fastest, then CP, then DP, then PP (megatron-core `parallel_state` order "tp-cp-ep-dp-pp", and
DeepSpeed `PipeModelDataParallelTopology` axes [pipe, data, model] whose data axis is DP x CP: context parallelism has
no parameters of its own, so for DeepSpeed a CP rank is one more data-parallel rank, see recipes.model.context).

Expert parallelism (`ep`) splits the data axis DP x CP for the experts of MoE layers only, as megatron-core's expert
rank generator does (tp-ep-dp-pp over the same ranks, cp folded into dp): with x = cp_rank + cp x dp_rank a rank's
index on the data axis, it holds expert shard x % ep and is expert-data-parallel rank x // ep; its expert gradients
are reduced over the dp x cp / ep ranks with the same shard (the expert-data-parallel group). Without CP that is DP
index d holding shard d % ep (EP fastest inside DP, as DeepSpeed's `_get_expert_parallel_ranks`); with CP an EP group
spans the CP ranks of a replica first (MoE layers route tokens one by one, so where a token's sequence chunk lives does
not matter to them).
"""
from __future__ import annotations

from dataclasses import dataclass

from recipes.config.problem import Problem


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero_stage: int = 1
    micro_batch: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"  # none | selective | full
    cp: int = 1  # context parallelism: each micro-batch's sequence split over cp ranks (recipes.model.context)
    ep: int = 1  # expert parallelism inside DP x CP (MoE layers only; see the module docstring)
    vpp: int = 1  # virtual pipeline stages: model chunks per pipeline rank (recipes.parallel.pipeline)
    schedule: str = "1f1b"  # pipeline schedule: 1f1b | interleaved_1f1b | zero_bubble (resolved from "auto")

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def data_axis(self) -> int:
        """DeepSpeed's data-parallel size: DP x CP (gradients are reduced and ZeRO shards over both)."""
        return self.dp * self.cp

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp

    def grad_accum_steps(self, global_batch: int) -> int:
        """Micro-batches per step per DP rank (= pipeline micro-batches m)."""
        per_step = self.micro_batch * self.dp
        if global_batch % per_step:
            raise ValueError(
                f"global batch {global_batch} is not a multiple of micro_batch x dp = {self.micro_batch} x {self.dp}"
            )
        return global_batch // per_step

    def problems(self, model_cfg, global_batch: int | None = None, partition: str | None = None,
                 max_tp: int | None = None) -> list[Problem]:
        """Every reason this layout cannot train `model_cfg` (empty = it can). `partition` (the recipe's
        parallel.pipeline_partition) adds the pipeline-split check; `max_tp` bounds the TP degrees suggested."""
        out = self._tensor_split_problems(model_cfg, max_tp)
        out += self._pipeline_split_problems(model_cfg, partition)
        out += self._pipeline_schedule_problems(model_cfg)
        out += self._micro_batch_round_problems(global_batch)
        if self.zero_stage >= 2 and self.pp > 1:
            why = ("ZeRO-2 reduces each gradient while the engine runs the backward, and the pipeline schedule runs "
                   "it outside the engine (DeepSpeed 0.19's ZeRO-2 fails at the first step under it)"
                   if self.zero_stage == 2 else "ZeRO-3 would gather every stage's weights again for each micro-batch "
                   "and chunk the schedule runs, outside the engine that gathers them")
            out.append(Problem("parallel.zero_stage", f"parallel.zero_stage={self.zero_stage} with parallel.pp="
                                     f"{self.pp}: {why}", "set parallel.zero_stage=1 or parallel.pp=1 (ZeRO-1 shards "
                                     "the optimizer state over DP, most of ZeRO's saving at PP > 1)"))
        if self.sequence_parallel and self.tp == 1:
            out.append(Problem("parallel.sequence_parallel", "parallel.sequence_parallel=true needs parallel.tp "
                                     "> 1 (it splits the TP all-reduce regions along the sequence)",
                                     "set parallel.sequence_parallel=false or tp >= 2"))
        out += self._sequence_split_problems(model_cfg)
        out += self._expert_problems(model_cfg)
        if global_batch is not None and global_batch % (self.micro_batch * self.dp):
            per = self.micro_batch * self.dp
            out.append(Problem("training.global_batch", f"training.global_batch={global_batch} is not a multiple "
                                     f"of parallel.micro_batch x dp = {self.micro_batch} x {self.dp} = {per}",
                                     f"use global_batch={_round_to(global_batch, per)} (a multiple of {per}) or a "
                                     f"parallel.micro_batch dividing {max(1, global_batch // self.dp)}"))
        return out

    def _tensor_split_problems(self, model_cfg, max_tp: int | None) -> list[Problem]:
        """Heads, KV groups and the dense MLP split over TP ranks (megatron-core's parallel linears)."""
        out: list[Problem] = []
        tp, heads, groups = self.tp, model_cfg.num_attention_heads, model_cfg.query_groups
        limit = max_tp or heads
        if heads % tp:
            out.append(Problem("parallel.tp", f"model.num_attention_heads={heads} is not divisible by "
                                     f"parallel.tp={tp}", f"use tp in {_divisors_upto(heads, limit)}"))
        if groups % tp and groups != heads:
            out.append(Problem("parallel.tp", f"model.num_query_groups={groups} is not divisible by "
                                     f"parallel.tp={tp}", f"use tp in {_divisors_upto(groups, limit)} (each TP rank "
                                     f"needs whole KV groups)"))
        ffn = model_cfg.ffn_size  # the dense MLP's, where a layer has one
        if ffn % tp and any(not model_cfg.is_moe_layer(i) for i in range(model_cfg.num_layers)):
            out.append(Problem("parallel.tp", f"model.ffn_hidden_size={ffn} is not divisible by parallel.tp="
                                     f"{tp}: the MLP is split over TP ranks (megatron-core's parallel linears)",
                                     f"use a multiple of {tp}, or tp in {_divisors_upto(ffn, limit)}"))
        return out

    def _pipeline_split_problems(self, model_cfg, partition: str | None) -> list[Problem]:
        """Every stage needs a layer; under ZeRO-1 every stage needs the same optimizer param groups."""
        pp = self.pp
        if pp > model_cfg.num_layers:
            return [Problem("parallel.pp", f"parallel.pp={pp} is larger than model.num_layers="
                                  f"{model_cfg.num_layers}: every stage needs at least one layer",
                                  f"use pp <= {model_cfg.num_layers}")]
        if not (pp > 1 and self.zero_stage == 1 and (partition == "parameters" or self.ep > 1)):
            # (the uniform split gives every stage decoder layers, so only the parameter split can go wrong; with
            # expert parallelism a stage without MoE layers also lacks the experts' param group)
            return []
        from recipes.parallel.partition import UNEVEN_GROUPS_FIX, layer_names, rank_layers, uneven_group_problem
        problem = uneven_group_problem(layer_names(model_cfg), rank_layers(
            model_cfg, self.tp, pp, self.vpp, partition or "uniform", self.ep), self.ep)
        if problem and "MoE" in problem:
            return [Problem("model.moe.layer_pattern", f"parallel.ep={self.ep} at parallel.pp={pp}: stages get "
                                  f"different optimizer param groups ({problem})",
                                  "DeepSpeed's ZeRO-1 would hang in the first optimizer step; give every pipeline "
                                  "stage at least one MoE layer (model.moe.layer_pattern, first_dense_layers or "
                                  "another parallel.pp), or use parallel.ep=1")]
        if problem:
            return [Problem("parallel.pipeline_partition", f"parallel.pipeline_partition=parameters at "
                                  f"parallel.pp={pp} gives stages different optimizer param groups ({problem})",
                                  UNEVEN_GROUPS_FIX)]
        return []

    def _micro_batch_round_problems(self, global_batch: int | None) -> list[Problem]:
        """Interleaved and zero-bubble schedules run the micro-batches in rounds of pp."""
        pp = self.pp
        if global_batch is None or pp == 1 or self.schedule == "1f1b" or global_batch % (self.micro_batch * self.dp):
            return []
        m = global_batch // (self.micro_batch * self.dp)
        rounds = max(1, m // pp)
        if m % rounds == 0:
            return []
        good = [k * pp for k in range(1, 5)]
        return [Problem("training.global_batch", f"parallel.pipeline_schedule={self.schedule} runs the "
                              f"micro-batches in rounds of parallel.pp={pp}: {m} micro-batches per step "
                              f"(global_batch / (micro_batch x dp)) do not make whole rounds",
                              f"use a multiple of pp micro-batches, e.g. global_batch = "
                              f"{good[0] * self.micro_batch * self.dp} or {good[1] * self.micro_batch * self.dp}, or "
                              f"pipeline_schedule=1f1b")]

    def _pipeline_schedule_problems(self, model_cfg) -> list[Problem]:
        """Virtual stages and the schedule: each of the pp x vpp chunks needs a decoder layer; 1F1B runs one chunk
        per rank, interleaved 1F1B several."""
        out: list[Problem] = []
        pp, vpp, layers = self.pp, self.vpp, model_cfg.num_layers
        if vpp > 1 and pp == 1:
            out.append(Problem("parallel.vpp", f"parallel.vpp={vpp} with parallel.pp=1: virtual stages split a "
                                     "pipeline rank's layers, and there is no pipeline", "set parallel.vpp=1 or "
                                     "parallel.pp >= 2"))
        elif pp * vpp > layers and pp <= layers:
            fits = [v for v in range(1, layers // pp + 1)]
            out.append(Problem("parallel.vpp", f"parallel.pp x vpp = {pp} x {vpp} = {pp * vpp} model chunks for "
                                     f"model.num_layers={layers}: every chunk needs at least one decoder layer",
                                     f"use vpp in {fits}"))
        if self.schedule == "1f1b" and vpp > 1:
            out.append(Problem("parallel.pipeline_schedule", f"parallel.pipeline_schedule=1f1b runs one model "
                                     f"chunk per pipeline rank, but parallel.vpp={vpp}", "use pipeline_schedule="
                                     "interleaved_1f1b (or auto, or zero_bubble), or set parallel.vpp=1"))
        elif self.schedule == "interleaved_1f1b" and vpp == 1 and pp > 1:
            out.append(Problem("parallel.pipeline_schedule", "parallel.pipeline_schedule=interleaved_1f1b needs "
                                     "several model chunks per pipeline rank, but parallel.vpp=1",
                                     "set parallel.vpp >= 2 (e.g. 2), or use pipeline_schedule=1f1b"))
        return out

    def _sequence_split_problems(self, model_cfg) -> list[Problem]:
        """CP cuts each sequence into 2 x cp equal chunks (rank i holds chunks i and 2cp-1-i); SP then splits a CP
        rank's s / cp tokens over the TP ranks."""
        out: list[Problem] = []
        s, cp, tp = model_cfg.seq_length, self.cp, self.tp
        if cp > 1 and s % (2 * cp):
            fits = [c for c in range(1, min(s // 2, 2 * cp) + 1) if s % (2 * c) == 0]
            out.append(Problem("parallel.cp", f"model.seq_length={s} is not divisible by 2 x parallel.cp = "
                                     f"{2 * cp} (each CP rank holds two equal chunks of the sequence)",
                                     f"use cp in {fits} or a model.seq_length divisible by {2 * cp}"))
        elif self.sequence_parallel and tp > 1 and (s // cp) % tp:
            out.append(Problem("parallel.sequence_parallel", f"parallel.sequence_parallel=true splits each "
                                     f"rank's model.seq_length / cp = {s // cp} tokens over parallel.tp={tp}, which "
                                     f"does not divide them", f"use a model.seq_length divisible by {tp * cp} or "
                                     "set parallel.sequence_parallel=false"))
        return out

    def _expert_problems(self, model_cfg) -> list[Problem]:
        """The MoE / expert-parallel rules (model.moe and parallel.ep)."""
        out: list[Problem] = []
        moe, ep, data = model_cfg.moe, self.ep, self.data_axis
        if moe is None:
            if ep > 1:
                out.append(Problem("parallel.ep", f"parallel.ep={ep} but the model has no experts (no model.moe)",
                                         "set parallel.ep=1, or add a model.moe section"))
            return out
        if self.zero_stage == 3:
            out.append(Problem("parallel.zero_stage", "parallel.zero_stage=3 with model.moe: DeepSpeed's ZeRO-3 "
                                     "does not support mixture-of-experts parameters",
                                     "use parallel.zero_stage=1 or 2"))
        if ep > 1 and self.zero_stage == 0:
            out.append(Problem("parallel.zero_stage", f"parallel.zero_stage=0 with parallel.ep={ep}: expert "
                                     "gradients are reduced over the expert-data-parallel group by DeepSpeed's ZeRO "
                                     "optimizer only", "use parallel.zero_stage=1 (or 2 with pp=1)"))
        axis = "dp" if self.cp == 1 else f"dp x cp = {self.dp} x {self.cp}"
        fits = [d for d in _divisors_upto(moe.num_experts, data) if data % d == 0]
        if moe.num_experts % ep:
            out.append(Problem("parallel.ep", f"model.moe.num_experts={moe.num_experts} is not divisible by "
                                     f"parallel.ep={ep} (each EP rank holds num_experts / ep whole experts)",
                                     f"use ep in {fits} (divisors of num_experts and of {axis}={data})"))
        elif data % ep:
            what = "the data-parallel degree dp" if self.cp == 1 else f"the data axis {axis}"
            out.append(Problem("parallel.ep", f"parallel.ep={ep} does not divide {what}={data}: experts are "
                                     f"split over ranks inside it", f"use ep in {fits} (divisors of num_experts and "
                                     f"of {data}), or change dp"))
        if self.tp > 1:
            out += self._expert_tp_problems(model_cfg)
        return out

    def _expert_tp_problems(self, model_cfg) -> list[Problem]:
        """Experts are split over TP like the dense MLP (megatron-core expert TP = TP); without sequence parallelism
        each TP rank routes 1/tp of its (CP rank's) sequence (the MoE layer is sequence-parallel inside)."""
        out: list[Problem] = []
        tp, cp, moe = self.tp, self.cp, model_cfg.moe
        sizes = [("model.moe.ffn_hidden_size", model_cfg.expert_ffn_size)]
        if moe.shared_expert_ffn_size:
            sizes.append(("model.moe.shared_expert_ffn_size", moe.shared_expert_ffn_size))
        for field, size in sizes:
            if size % tp:
                out.append(Problem(field, f"{field}={size} is not divisible by parallel.tp={tp} (experts are "
                                         "split over TP ranks)", f"use a multiple of {tp}, or tp in "
                                         f"{_divisors_upto(size, tp)}"))
        s = model_cfg.seq_length
        local = s // cp  # a CP rank's tokens (when cp does not cut the sequence evenly, parallel.cp is refused)
        if (cp == 1 or s % (2 * cp) == 0) and local % tp and not self.sequence_parallel:  # SP: said above
            where = f"model.seq_length={s}" if cp == 1 else f"model.seq_length / cp = {s} / {cp} = {local}"
            out.append(Problem("model.seq_length", f"{where} is not divisible by parallel.tp={tp}: each TP rank "
                                     "routes an equal slice of the sequence to the experts",
                                     f"use a model.seq_length divisible by {tp * cp}"))
        return out

    # The rank order, encoded here once: TP fastest, then CP, then DP, then PP. Everything else derives from it:
    # coords / rank below, megatron-core's order string (`megatron_order`, which builds every group from it:
    # recipes.train.groups, which checks the groups it got against `coords`), DeepSpeed's view through the mpu.
    RANK_ORDER = ("tp", "cp", "dp", "pp")

    @property
    def megatron_order(self) -> str:
        """RANK_ORDER as megatron-core's `initialize_model_parallel(order=...)` takes it: EP sits right before DP (it
        splits the data axis DP x CP for the experts; see the module docstring)."""
        return "-".join(self.RANK_ORDER).replace("dp", "ep-dp")

    def coords(self, rank: int) -> dict[str, int]:
        """(tp, cp, dp, pp) coordinates of a global rank."""
        out = {}
        for dim in self.RANK_ORDER:
            size = getattr(self, dim)
            out[dim], rank = rank % size, rank // size
        return out

    def rank(self, tp: int, dp: int, pp: int, cp: int = 0) -> int:
        at = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        rank = 0
        for dim in reversed(self.RANK_ORDER):
            rank = rank * getattr(self, dim) + at[dim]
        return rank

    def expert_coords(self, rank: int) -> dict[str, int]:
        """A rank's expert shard (ep) and expert-data-parallel index (edp): with x = cp + cp_size x dp its index on
        the data axis DP x CP, shard x % ep and EDP index x // ep (megatron-core's expert rank generator)."""
        c = self.coords(rank)
        x = c["cp"] + self.cp * c["dp"]
        return {"ep": x % self.ep, "edp": x // self.ep}

    def describe(self) -> str:
        extra = []
        if self.ep > 1:
            extra.append(f"EP={self.ep} (experts, inside DP{' x CP' if self.cp > 1 else ''})")
        if self.sequence_parallel:
            extra.append("SP")
        if self.recompute != "none":
            extra.append(f"recompute={self.recompute}")
        if self.pp > 1 and (self.vpp > 1 or self.schedule != "1f1b"):
            extra.insert(0, f"VPP={self.vpp}, schedule {self.schedule}")
        tail = (", " + ", ".join(extra)) if extra else ""
        cp = f" x CP={self.cp}" if self.cp > 1 else ""
        return (f"TP={self.tp}{cp} x PP={self.pp} x DP={self.dp}, ZeRO-{self.zero_stage}, micro-batch "
                f"{self.micro_batch}{tail}")

    @classmethod
    def from_recipe(cls, recipe, world_size: int | None = None) -> "Layout":
        """Build the layout from a recipe; dp is derived from world_size (or the cluster) when not given."""
        p = recipe.parallel
        if p.dp is not None:
            dp = p.dp
        else:
            ws = world_size if world_size is not None else recipe.cluster.world_size
            names, values, mp = _replica(p)
            if ws % mp:
                raise ValueError(f"world size {ws} is not divisible by {names} = {values}")
            dp = ws // mp
        return cls(
            tp=p.tp,
            pp=p.pp,
            dp=dp,
            zero_stage=p.zero_stage,
            micro_batch=p.micro_batch,
            sequence_parallel=p.sequence_parallel,
            recompute=p.recompute,
            cp=p.cp,
            ep=p.ep,
            vpp=p.vpp,
            schedule=resolve_schedule(p.pipeline_schedule, p.vpp),
        )


def resolve_layout(recipe, world_size: int | None = None, world_source: str | None = None,
                   max_tp: int | None = None) -> tuple[Layout | None, list[Problem]]:
    """The recipe's layout at `world_size` ranks (default: the cluster's) and every problem with it. The layout is
    None when the degrees do not fit the world size (then the problems say why). `world_source` says where the
    world size comes from, for the messages (e.g. "the hostfile selection")."""
    p, cl = recipe.parallel, recipe.cluster
    world = world_size if world_size is not None else cl.world_size
    source = world_source or f"{cl.nodes} nodes x {cl.gpus_per_node} GPUs"
    names, values, mp = _replica(p)
    problems: list[Problem] = []
    dp = None
    if p.dp is not None:
        if mp * p.dp != world:
            fix = (f"set parallel.dp={world // mp} or remove parallel.dp to derive it" if world % mp == 0
                   else "remove parallel.dp to derive it") + f", or launch {mp * p.dp} ranks"
            problems.append(Problem("parallel.dp", f"parallel.{names} x dp = {values} x {p.dp} = "
                                          f"{mp * p.dp} but the world size is {world} ({source})", fix))
        else:
            dp = p.dp
    elif world % mp:
        problems.append(Problem("parallel.tp", f"world size {world} ({source}) is not divisible by parallel."
                                      f"{names} = {values}", f"launch a multiple of {names} = {mp} ranks, or choose "
                                      f"{names} among the divisors of {world}: {_divisors_upto(world, world)}"))
    else:
        dp = world // mp
    pipe = dict(vpp=p.vpp, schedule=resolve_schedule(p.pipeline_schedule, p.vpp))
    lay = None if dp is None else Layout(tp=p.tp, pp=p.pp, dp=dp, zero_stage=p.zero_stage, micro_batch=p.micro_batch,
                                         sequence_parallel=p.sequence_parallel, recompute=p.recompute, cp=p.cp,
                                         ep=p.ep, **pipe)
    probe = lay or Layout(tp=p.tp, pp=p.pp, dp=p.ep, zero_stage=p.zero_stage, micro_batch=p.micro_batch,
                          sequence_parallel=p.sequence_parallel, recompute=p.recompute, cp=p.cp, ep=p.ep, **pipe)
    # Without a valid dp the batch rule cannot be judged; the rest can.
    problems += probe.problems(recipe.model, recipe.training.global_batch if lay else None,
                               p.pipeline_partition, max_tp)
    return lay, problems


SCHEDULES = ("1f1b", "interleaved_1f1b", "zero_bubble")


def pipeline_bubble(schedule: str, pp: int, vpp: int, m: int, weight_share: float = 1 / 3) -> float:
    """The pipeline bubble as a fraction of the compute time: idle time per rank over its forward and backward time.

    1F1B: (p-1)/m (Narayanan et al. 2021); interleaved 1F1B over v chunks: (p-1)/(v m). Zero-bubble (torch's
    ScheduleInterleavedZeroBubble, ZB-H1 of Qi et al. 2023 interleaved over v chunks) defers each backward's
    weight half W into the bubble, leaving (p-1)(F + B - W) of the 1F1B bubble's (p-1)(F + B + W) per chunk:
    (p-1)/(v m) x (1 - 2 w) with w = W / (F + B + W), the weight half's share of a micro-batch's work (1/3 when the
    forward, the input backward and the weight backward cost the same, the paper's and our measured default)."""
    if pp <= 1:
        return 0.0
    base = (pp - 1) / (vpp * m)
    return base * (1 - 2 * weight_share) if schedule == "zero_bubble" else base


def resolve_schedule(name: str, vpp: int) -> str:
    """parallel.pipeline_schedule with "auto" resolved: plain 1F1B for one chunk per rank, interleaved 1F1B for more."""
    if name == "auto":
        return "1f1b" if vpp == 1 else "interleaved_1f1b"
    return name


def _replica(p) -> tuple[str, str, int]:
    """The degrees of one data-parallel replica (tp x pp, and cp when used): their names, values and product."""
    if p.cp > 1:
        return "tp x cp x pp", f"{p.tp} x {p.cp} x {p.pp}", p.tp * p.cp * p.pp
    return "tp x pp", f"{p.tp} x {p.pp}", p.tp * p.pp


def _divisors_upto(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _round_to(value: int, multiple: int) -> int:
    return max(multiple, round(value / multiple) * multiple)

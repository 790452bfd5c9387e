"""The one object for the parallel layout: validation, the planner, model construction, the DeepSpeed JSON and the
launcher's world-size check all read it.

Rank order is TP fastest, then DP, then PP (megatron-core `parallel_state` order "tp-dp-pp" with cp=ep=1, and
DeepSpeed `PipeModelDataParallelTopology` axes [pipe, data, model]).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero_stage: int = 1
    micro_batch: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"  # none | selective | full

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

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

    def coords(self, rank: int) -> dict[str, int]:
        """(tp, dp, pp) coordinates of a global rank."""
        return {
            "tp": rank % self.tp,
            "dp": (rank // self.tp) % self.dp,
            "pp": rank // (self.tp * self.dp),
        }

    def rank(self, tp: int, dp: int, pp: int) -> int:
        return tp + self.tp * (dp + self.dp * pp)

    def describe(self) -> str:
        extra = []
        if self.sequence_parallel:
            extra.append("SP")
        if self.recompute != "none":
            extra.append(f"recompute={self.recompute}")
        tail = (", " + ", ".join(extra)) if extra else ""
        return f"TP={self.tp} x PP={self.pp} x DP={self.dp}, ZeRO-{self.zero_stage}, micro-batch {self.micro_batch}{tail}"

    @classmethod
    def from_recipe(cls, recipe, world_size: int | None = None) -> "Layout":
        """Build the layout from a recipe; dp is derived from world_size (or the cluster) when not given."""
        p = recipe.parallel
        if p.dp is not None:
            dp = p.dp
        else:
            ws = world_size if world_size is not None else recipe.cluster.world_size
            mp = p.tp * p.pp
            if ws % mp:
                raise ValueError(f"world size {ws} is not divisible by tp x pp = {p.tp} x {p.pp}")
            dp = ws // mp
        return cls(
            tp=p.tp,
            pp=p.pp,
            dp=dp,
            zero_stage=p.zero_stage,
            micro_batch=p.micro_batch,
            sequence_parallel=p.sequence_parallel,
            recompute=p.recompute,
        )

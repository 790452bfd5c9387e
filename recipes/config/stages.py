"""Data stages as whole steps: where each stage of `data.stages` starts and ends, and the lr its segment sets.

A stage is a span of optimizer steps [start, end) (0-based; training step k, counted from 1, is index k - 1) and so
a span of consumed samples [start x global_batch, end x global_batch): a step never straddles two stages, and the
checkpointed consumed-sample count alone says which stage a resumed run is in and where inside it.

Pure arithmetic on the recipe: the schema (`Recipe` validator), the planner's validation and the training loop all
read the same plan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class StageSpan:
    index: int
    name: str
    start: int  # first step index (0-based) of the stage
    end: int  # one past its last step index
    stage: object  # the schema's DataStage

    @property
    def steps(self) -> int:
        return self.end - self.start


def _field(i: int, stage) -> str:
    return f"data.stages.{i}" + (f" ({stage.name})" if stage.name else "")


def stage_plan(recipe) -> list[StageSpan]:
    """The stages of `recipe` as step spans covering the run exactly; [] without stages. Raises ValueError naming the
    field and the fix when the stages do not fit the run."""
    stages = recipe.data.stages
    if not stages:
        return []
    tr = recipe.training
    total = tr.steps(recipe.model.seq_length)
    per_step = tr.global_batch * recipe.model.seq_length
    lengths: list[Optional[int]] = []
    names = []
    for i, s in enumerate(stages):
        names.append(s.name or f"stage{i}")
        if s.steps is not None:
            lengths.append(s.steps)
        elif s.tokens is not None:
            lengths.append(-(-s.tokens // per_step))  # whole steps: the switch happens between two steps
        else:
            lengths.append(None)
        if not (s.manifests or s.blend or recipe.data.manifests or recipe.data.blend):
            raise ValueError(f"{_field(i, s)}: no manifests or blend, and data.manifests / data.blend are empty; "
                             f"give the stage its data (manifests: [DIR/manifest.json])")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"data.stages: stage name(s) {', '.join(dupes)} used twice; give every stage its own name")
    open_ = [i for i, n in enumerate(lengths) if n is None]
    if len(open_) > 1:
        raise ValueError(f"data.stages: {', '.join(_field(i, stages[i]) for i in open_)} all leave steps/tokens out; "
                         "only one stage may take the rest of the run, give the others steps or tokens")
    fixed = sum(n for n in lengths if n is not None)
    run = (f"training.train_steps={tr.train_steps}" if tr.train_steps
           else f"training.train_tokens={tr.train_tokens} ({total} steps)")
    if open_:
        rest = total - fixed
        if rest < 1:
            raise ValueError(f"data.stages: the stages with a length take {fixed} steps, leaving {rest} for "
                             f"{_field(open_[0], stages[open_[0]])} in a run of {run}; shorten them or lengthen the run")
        lengths[open_[0]] = rest
    elif fixed != total:
        raise ValueError(f"data.stages: the stages add up to {fixed} steps but the run has {run}; make them add up "
                         f"(or leave one stage's steps/tokens out so that it takes the rest)")
    spans, start = [], 0
    for i, (s, n) in enumerate(zip(stages, lengths)):
        spans.append(StageSpan(i, names[i], start, start + n, s))
        start += n
    return spans


def stage_at(plan: list[StageSpan], step_index: int) -> StageSpan:
    """The stage that step index `step_index` (0-based) belongs to."""
    for span in plan:
        if step_index < span.end:
            return span
    return plan[-1]


def with_stage_lr(plan: list[StageSpan], base: Callable[[int], float], peak_lr: float) -> Callable[[int], float]:
    """step index -> lr / peak: `base` (training.schedule) except inside stages with an lr segment, which go from
    start_lr (default: the lr at the boundary: the previous stage's end_lr when it has a segment, else `base` there)
    to end_lr over the stage, with the run schedule's convention (end_lr is reached at the step after the stage)."""
    segments = []  # (start, end, start multiplier, end multiplier, decay)
    previous_end = None
    for span in plan:
        seg = span.stage.lr
        if seg is None:
            previous_end = None
            continue
        first = seg.start_lr / peak_lr if seg.start_lr else (previous_end if previous_end is not None
                                                             else base(span.start))
        last = seg.end_lr / peak_lr
        segments.append((span.start, span.end, first, last, seg.decay))
        previous_end = first if seg.decay == "constant" else last
    if not segments:
        return base

    def f(step: int) -> float:
        for start, end, first, last, decay in segments:
            if start <= step < end:
                if decay == "constant":
                    return first
                p = (step - start) / (end - start)
                shape = 1.0 - p if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
                return last + (first - last) * shape
        return base(step)

    return f

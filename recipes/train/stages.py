"""Training data with stages: one megatron-core dataset per stage of `data.stages`, addressed by consumed samples.

The loop's samples are addressed by the global consumed-sample count (recipes.train.data); `StagedDataset` maps that
count to (stage, sample within the stage): global sample k of the stage that starts at sample S is that stage's
dataset item k - S. So the switch happens exactly at the boundary step, each stage's dataset is read from its first
sample whatever came before, and a resumed run (which restores the count) lands on the same sample of the same stage.
"""
from __future__ import annotations

import logging

from recipes.config.stages import StageSpan, stage_plan
from recipes.train.data import DataError, build_datasets, load_blend

log = logging.getLogger(__name__)


class StagedDataset:
    """Global sample index -> the item of the stage it falls in, indexed from that stage's start."""

    def __init__(self, plan: list[StageSpan], datasets: list, global_batch: int):
        self.plan = plan
        self.ranges = [(span.start * global_batch, span.end * global_batch, ds) for span, ds in zip(plan, datasets)]

    def __len__(self) -> int:
        return self.ranges[-1][1]

    def __getitem__(self, k: int):
        for lo, hi, ds in self.ranges:
            if k < hi:
                return ds[(k - lo) % len(ds)]
        raise IndexError(f"sample {k} is past the last stage (ends at {len(self)})")


def build_stage_datasets(recipe, valid_samples: int, cache_dir: str):
    """(StagedDataset, validation dataset, plan). Validation reads data.manifests / data.blend when set, else the
    first stage's blend: one validation set for the whole run, so its curve shows the model, not the data switch."""
    plan = stage_plan(recipe)
    gb = recipe.training.global_batch
    first = None
    for span in plan:  # every stage's data is checked before step 1, not at hour 900
        tok = load_blend(recipe, span.stage).tokenizer
        first = first or (span.name, tok)
        if (tok.vocab_size, tok.eod) != (first[1].vocab_size, first[1].eod):
            raise DataError(f"data.stages: stage {span.name}'s tokenizer (vocab {tok.vocab_size}, eod {tok.eod}) "
                            f"differs from stage {first[0]}'s (vocab {first[1].vocab_size}, eod {first[1].eod}); "
                            "tokenize every stage's data with one tokenizer")
    trains, valid = [], None
    for span in plan:
        train, v = build_datasets(recipe, span.steps * gb, valid_samples, cache_dir, source=span.stage)
        trains.append(train)
        valid = valid if valid is not None else v
        log.info(f"data stage {span.name}: steps {span.start + 1}-{span.end} "
                 f"({span.steps * gb * recipe.model.seq_length:,} tokens)")
    if recipe.data.manifests or recipe.data.blend:
        _, valid = build_datasets(recipe, gb, valid_samples, cache_dir)
    return StagedDataset(plan, trains, gb), valid, plan

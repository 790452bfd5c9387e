"""Resume a checkpoint at another layout than it was saved at, straight from `recipes train` (reshard on load).

A tag DeepSpeed can load as it is (the same TP, PP, VPP, EP, ZeRO stage and, when ZeRO partitions over it, DP x CP,
in this project's format: recipes.checkpoint.relaunch.layout_changes) is loaded by DeepSpeed, bit for bit. Any other
tag, including one written by DeepSpeed's pipeline engine before format 2, is read by every rank for the slices its
engine holds, the way `checkpoint.init_from` and `recipes reshape` read one (recipes.checkpoint.format.relayout.Source:
ZeRO-1/2 partitions memory-mapped, one canonical tensor at a time; a ZeRO-3 source is read whole), and put where
DeepSpeed keeps it (recipes.checkpoint.format.engine_state): weights, fp32 masters, Adam's moments and step count, the
lr schedule; the training state (step, consumed samples, skipped steps, W&B run) comes from the tag's complete.json.
The source is never written; the first save of the resumed run writes the new layout.

What carries across exactly: the fp32 masters and Adam's moments (copied, not recomputed), the step and the lr, and
the data order: samples are addressed by the global consumed-sample count, so a DP change reads the same global
batches (no sample repeated or skipped) as long as training.global_batch is the same. What does not: the RNG streams,
which belong to ranks that no longer exist; each rank is reseeded from (training.seed, step, rank), the rule written
in `reseed`. With dropout off (every recipe here) no result depends on them. Sums over a different number of ranks
round differently, so the following losses agree with an uninterrupted run to float rounding, not bit for bit.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from recipes.checkpoint.format import deepspeed_private
from recipes.checkpoint.format.layout import detect_layout
from recipes.checkpoint.format.layout_record import layout_of, saved_layout
from recipes.checkpoint.format.tags import client_state as marked_client_state

log = logging.getLogger(__name__)


def loads_as_saved(tag_dir: Path, recipe, layout) -> bool:
    """DeepSpeed's own load_checkpoint can take this tag at `layout` (else: reshard on load)."""
    from recipes.checkpoint.relaunch import layout_changes

    if detect_layout(Path(tag_dir)).pipeline_files:
        return False
    return not layout_changes(saved_layout(Path(tag_dir)), layout_of(recipe, layout), recipe.model)


def load_resharded(eng, recipe, tag_dir: Path, tp_rank: int, ep_rank: int = 0) -> dict:
    """Collective: put this rank's part of `tag_dir` into `eng` (recipes.train.engine.Engine) at its own layout.
    Returns the tag's client state (step, consumed samples, ...)."""
    from recipes.checkpoint.format.engine_state import install_full_state
    from recipes.checkpoint.format.read import checkpoint_meta
    from recipes.checkpoint.init_from import open_source

    tag_dir = Path(tag_dir)
    source = open_source(tag_dir, recipe.model, moments=True)
    source.meta.update(checkpoint_meta(tag_dir, detect_layout(tag_dir), optimizer=True))
    install_full_state(eng, recipe, source, tp_rank, ep_rank, schedule=True)
    state = marked_client_state(tag_dir)
    deepspeed_private.set_progress(eng.engine, int(state.get("step", 0)), int(state.get("consumed_samples", 0)))
    reseed(recipe.training.seed, int(state.get("step", 0)))
    return state


def reseed(seed: int, step: int) -> None:
    """The RNG rule across a layout change: rank r's torch generators (CPU and, where present, CUDA) start from
    seed + 1,000,003 x step + r, the same on every relaunch of that layout at that step."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    value = seed + 1_000_003 * step + rank
    torch.manual_seed(value)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(value)

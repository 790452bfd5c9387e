"""Can a launch resume checkpoint.dir at the layout it asks for? Decided before any rank starts
(recipes.planner.validation.validate_for_launch) from the layout the newest complete tag records
(recipes.checkpoint.format.layout_record), instead of by load errors once every rank is up.

Loadable as it is, by DeepSpeed's own load_checkpoint at the new layout (`layout_changes` is empty): the same TP, PP,
VPP, EP, ZeRO stage, padded vocabulary and DP x CP. DP x CP is DeepSpeed's data axis, over which ZeRO partitions the
optimizer state; CP holds no parameters, so CP=2 x DP=1 files are those of CP=1 x DP=2 and a trade between the two
loads as it is (tests/training/test_context_parallel_resume.py). At ZeRO-0 nothing is partitioned over that axis, so
DP may change freely.

Any other change is resharded on load (recipes.checkpoint.reshard): `recipes train` reads the slices each rank needs
and goes on at the new layout. Refused here, naming both sides and the way forward: a source whose optimizer state
cannot be re-laid (ZeRO-0: torch keeps it without parameter names), a ZeRO-3 target (its partitions are not filled tensor by tensor),
and a different model.seq_length (a resumed run keeps its sequence length: its consumed-
samples count and data index are in sequences of that length; a longer-context stage is a new run started from this
one, checkpoint.init_from).
"""
from __future__ import annotations

import shlex
from pathlib import Path

from recipes.checkpoint.format.errors import CheckpointError
from recipes.checkpoint.format.layout_record import SavedLayout, layout_of, saved_layout
from recipes.checkpoint.format.tags import newest_complete
from recipes.config.problem import Problem


def relaunch_refusals(recipe, layout) -> list[Problem]:
    """Why `recipe` at `layout` (recipes.parallel.layout.Layout) cannot resume its checkpoint.dir ([] if it can, or
    if there is nothing to resume)."""
    c = recipe.checkpoint
    if not c.dir or not c.auto_resume:
        return []
    tag = newest_complete(c.dir)
    if tag is None:
        return []
    tag_dir = Path(c.dir) / tag
    try:
        saved = saved_layout(tag_dir)
    except CheckpointError as e:
        return [Problem("checkpoint.dir", f"checkpoint.dir = {c.dir}: the layout of {tag} cannot be read: {e}",
                        "move the damaged tag aside, or set checkpoint.dir to another directory")]
    wanted = layout_of(recipe, layout)
    out = []
    changes = layout_changes(saved, wanted, recipe.model)
    if changes:
        why = _why_not_resharded(saved, wanted)
        if why:
            out.append(Problem("parallel", f"checkpoint.dir = {c.dir} holds {tag}, saved at {saved.describe()}; this "
                               f"launch is {wanted.describe()} ({', '.join(changes)}), and {why}",
                               _reshape_fix(c.dir, tag, saved, wanted, recipe.model)))
    if saved.seq_length is not None and saved.seq_length != wanted.seq_length:
        out.append(Problem("model.seq_length", f"checkpoint.dir = {c.dir} holds {tag} of a run at model.seq_length="
                           f"{saved.seq_length}; this launch has model.seq_length={wanted.seq_length}: a resumed run "
                           "keeps its sequence length (its consumed samples and data index count sequences of that "
                           "length)", f"resume with model.seq_length={saved.seq_length}; for a stage at "
                           f"{wanted.seq_length} tokens start a new run from this one: checkpoint.dir=NEW_DIR "
                           f"checkpoint.init_from={c.dir}"))
    return out


def _why_not_resharded(saved: SavedLayout, wanted: SavedLayout) -> str | None:
    """Why `recipes train` cannot reshard this tag on load (None: it can)."""
    if saved.zero_stage == 0:
        return "a ZeRO-0 checkpoint's optimizer state cannot be resharded (torch keeps it without parameter names)"
    if wanted.zero_stage == 3:
        return "resharding on load fills ZeRO-0/1/2 engines, not ZeRO-3 partitions"
    return None


def layout_changes(saved: SavedLayout, wanted: SavedLayout, model_cfg) -> list[str]:
    """The differences DeepSpeed's load cannot take ([] if it loads as it is; the rest is resharded on load, see
    `relaunch_refusals`). The padded vocabulary is named when
    model.make_vocab_size_divisible_by changed (a TP change pads it anew by itself)."""
    out = []
    for name, a, b in (("TP", saved.tp, wanted.tp), ("PP", saved.pp, wanted.pp), ("EP", saved.ep, wanted.ep),
                       ("VPP", saved.vpp if saved.pp > 1 else 1, wanted.vpp if wanted.pp > 1 else 1)):
        if a != b:
            out.append(f"{name}={b} (saved {name}={a})")
    # ZeRO-0 partitions nothing: the optimizer state is in the model-parallel ranks' files, which every data-parallel
    # rank loads, so DP x CP may change (fewer or more nodes) without a reshape
    partitioned = saved.zero_stage > 0 or wanted.zero_stage > 0
    if saved.data_axis != wanted.data_axis and partitioned:
        out.append(f"DP x CP={wanted.data_axis} (saved {saved.data_axis}; ZeRO partitions the optimizer over it)")
    if saved.zero_stage != wanted.zero_stage:
        out.append(f"ZeRO-{wanted.zero_stage} (saved ZeRO-{saved.zero_stage})")
    if _divisor_changed(saved, model_cfg):
        out.append(f"padded vocabulary {wanted.padded_vocab_size} (saved {saved.padded_vocab_size}: "
                   f"model.make_vocab_size_divisible_by={model_cfg.make_vocab_size_divisible_by} x tp pads it "
                   "otherwise)")
    return out


def _divisor_changed(saved: SavedLayout, model_cfg) -> bool:
    """The saved padded vocabulary is not what this recipe's make_vocab_size_divisible_by gives at the saved TP."""
    return saved.padded_vocab_size is not None and saved.padded_vocab_size != model_cfg.padded_vocab_size(saved.tp)


def reshaped_dir(ckpt_dir: str, w: SavedLayout) -> str:
    return f"{str(ckpt_dir).rstrip('/')}-tp{w.tp}-cp{w.cp}-pp{w.pp}-dp{w.dp}-zero{w.zero_stage}"


def _reshape_fix(ckpt_dir: str, tag: str, saved: SavedLayout, w: SavedLayout, model_cfg) -> str:
    """The reshape command to the wanted layout (the source's stored recipe.yaml is read with the recipe's
    make_vocab_size_divisible_by when that changed), and how to resume there."""
    divisible_by, divisor_changed = model_cfg.make_vocab_size_divisible_by, _divisor_changed(saved, model_cfg)
    if saved.zero_stage == 0:
        return (f"a ZeRO-0 checkpoint's optimizer state cannot be re-laid (torch keeps it without parameter names): "
                f"relaunch at the saved layout, or start a new run from its weights: checkpoint.dir=NEW_DIR "
                f"checkpoint.init_from={ckpt_dir}")
    if w.zero_stage == 3:  # neither resharding on load nor recipes reshape fill ZeRO-3 partitions
        return (f"resume at parallel.zero_stage={2 if w.pp == 1 else 1} (`recipes train` reshards it on load); a "
                "ZeRO-3 run resumes only a ZeRO-3 checkpoint of its own layout")
    extra = (f",ep={w.ep}" if w.ep > 1 or saved.ep > 1 else "") + (f",vpp={w.vpp}" if w.vpp > 1 else "")
    out = shlex.quote(reshaped_dir(ckpt_dir, w))
    vocab = f" model.make_vocab_size_divisible_by={divisible_by}" if divisor_changed else ""
    return (f"reshape it first: `python -m recipes reshape --checkpoint {shlex.quote(str(ckpt_dir))} --tag {tag} "
            f"--out {out} --to tp={w.tp},pp={w.pp},dp={w.dp},cp={w.cp}{extra},zero={w.zero_stage}{vocab}`, then "
            f"resume there: launch again with checkpoint.dir={out} (the original stays as it is)")

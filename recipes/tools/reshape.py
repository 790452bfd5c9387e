"""Re-shard a training checkpoint to another TP x PP x DP (x EP) layout (weights, fp32 masters, Adam moments and step,
lr schedule, consumed samples), so that the run resumes under the new layout with `recipes.train.cli`.

    python -m recipes reshape --checkpoint OLD_DIR [--tag global_stepN] --out NEW_DIR --to tp=1,pp=4,dp=2[,ep=2] \
        --config RECIPE [section.key=value ...]
    python -m recipes train --config RECIPE --local 8 ... checkpoint.dir=NEW_DIR parallel.tp=1 parallel.pp=4

How: ZeRO-1/2 sources to ZeRO-1/2 targets (tied or untied embeddings) are re-laid by the streaming writer
(recipes.checkpoint.format.relayout): `--workers N` processes (default: one per core) write the target's (pipeline
stage, TP rank) items tensor by tensor, each bounded by the largest tensor and one target rank's optimizer partition.
Other cases: the source is read offline into a full, name-keyed state (recipes.checkpoint.format.read), saved as a
full state directory (recipes.checkpoint.format.full_state) and written at the target layout by an engine built there
(one CPU process per target rank, recipes.train.state_writer), using DeepSpeed's own save. Targets the recipe cannot
run at (heads or query groups not divisible by tp, pp > layers, ZeRO-2/3 with pp > 1, batch not divisible by
micro_batch x dp) are refused with the validator's reason before anything is written.
Sources: ZeRO-1/2/3 (ZeRO-0 keeps unnamed optimizer state). Targets: ZeRO-0/1/2.
Mixture-of-experts models (any EP to any EP, `ep=N`, default the source's): the source is read by engines at its own
layout (recipes.train.state_reader: DeepSpeed loads its files, weights and Adam's moments are gathered over TP x EP),
the target written by the engine writer; the experts' split is recipes.checkpoint.format.expert_shards. A target
whose ep does not divide num_experts or DP x CP is refused with the validator's reason.
Context parallelism holds no parameters and DeepSpeed's data axis is DP x CP, so a CP run's files are those of a run
at DP x CP: a CP source is read as one, and a target `cp=N` (default 1) is written as DP x CP data ranks, its recipe
stored with its cp.
"""
from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

from recipes.config import file_mode
from recipes.config.logs import setup_logging
from recipes.config.loading import RecipeError
from recipes.config.cli_help import command_parser, refuse
from recipes.train.local_workers import cpu_only_workers

log = logging.getLogger(__name__)


def parse_target(spec: str) -> dict:
    """'tp=1,pp=4,dp=2,zero=1' -> {'tp': 1, 'pp': 4, 'dp': 2, 'zero_stage': 1} (and 'cp' / 'ep' / 'vpp': N when given;
    cp and vpp default to 1, ep to the source run's)."""
    out = {}
    for part in filter(None, spec.split(",")):
        key, _, value = part.partition("=")
        key = {"zero": "zero_stage"}.get(key.strip(), key.strip())
        if key not in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero_stage") or not value.strip().isdigit():
            raise RecipeError(f"--to {spec}: expected tp=N,pp=N,dp=N[,cp=N][,ep=N][,vpp=N][,zero=N], got '{part}'")
        out[key] = int(value)
    for key in ("tp", "pp", "dp"):
        if key not in out:
            raise RecipeError(f"--to {spec}: {key}=N is missing (give tp, pp and dp)")
    return out


def target_recipe(recipe, target: dict, source_zero: int):
    """The recipe at the target layout, validated for its world size (refusal names the reason)."""
    from recipes.train.cli import validate_recipe

    zero = target.get("zero_stage", source_zero if not (target["pp"] > 1 and source_zero > 1) else 1)
    if zero == 3:
        raise RecipeError("reshape writes ZeRO-0/1/2 checkpoints; use zero=1 or zero=2 (a ZeRO-3 run can resume "
                          "from a ZeRO-1/2 reshape only through export/import of the weights)")
    data = recipe.model_dump(mode="json")
    data["parallel"].update(tp=target["tp"], pp=target["pp"], dp=target["dp"], zero_stage=zero,
                            cp=target.get("cp", 1), ep=target.get("ep", recipe.parallel.ep),
                            vpp=target.get("vpp", 1), pipeline_schedule="auto")
    new = type(recipe).model_validate(data)
    world = target["tp"] * new.parallel.cp * target["pp"] * target["dp"]
    ep = f", ep={new.parallel.ep}" if recipe.model.moe is not None else ""
    try:
        validate_recipe(new, world)
    except (RecipeError, ValueError) as e:
        raise RecipeError(f"cannot reshape to tp={target['tp']}, pp={target['pp']}, dp={target['dp']}, "
                          f"cp={new.parallel.cp}{ep}, ZeRO-{zero}: {_one_line(str(e))}") from e
    return new, world


def _one_line(text: str) -> str:
    """The validator's list of errors ("recipe 'x' has N error(s):" then "  - ..." lines) as one line."""
    lines = text.splitlines()
    if len(lines) > 1 and lines[0].endswith("error(s):"):
        return "; ".join(line.strip().removeprefix("- ") for line in lines[1:])
    return text


def as_data_parallel(recipe):
    """The recipe with CP folded into DP (dp x cp, cp 1): the DeepSpeed files of a CP run are those of a run at
    DP x CP (CP has no parameters; DeepSpeed's data axis is DP x CP), so a CP source reads as one and a CP target is
    written as one (recipes.model.context)."""
    p = recipe.parallel
    if p.cp == 1:
        return recipe
    data = recipe.model_dump(mode="json")
    data["parallel"].update(dp=(p.dp or 1) * p.cp, cp=1)
    return type(recipe).model_validate(data)


def reshape(ckpt_dir: str, out_dir: str, recipe, target: dict, tag: str | None = None, quiet: bool = False,
            writer: str = "auto", workers: int | None = None) -> Path:
    """writer: "stream" (worker processes over the target's (stage, TP rank) items, tensor by tensor:
    recipes.checkpoint.format.relayout), "engine" (an engine per target rank: recipes.train.state_writer) or "auto"
    (stream where it applies). workers: the streaming writer's processes (None: one per core, at most one per item)."""
    from recipes.checkpoint.format.tags import resolve_tag

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; remove it or choose another --out")
    tag_dir = resolve_tag(ckpt_dir, tag)  # before the heavy imports: a bad --tag costs nothing
    from recipes.checkpoint.format.layout import detect_layout
    from recipes.checkpoint.format.relayout import unsupported

    source = detect_layout(tag_dir)  # a CP run's files read as DP x CP data-parallel ranks
    new, world = target_recipe(recipe, target, source.zero_stage)
    written = as_data_parallel(new)  # what the writers lay out; `new` (with its cp) is the recipe stored
    why_not = unsupported(source, recipe, new.parallel.zero_stage)
    if writer == "stream" and why_not:
        raise RecipeError(f"--writer stream cannot re-lay this checkpoint: {why_not}; use --writer engine")
    streaming = writer != "engine" and not why_not
    log.info(f"reshape: {source.describe()} -> TP={target['tp']} x CP={new.parallel.cp} x PP={target['pp']} x "
             f"DP={target['dp']}{_ep_of(new)}, "
        f"ZeRO-{new.parallel.zero_stage}; " + ("streaming writer" if streaming else
                                              f"engine writer, {world} processes" + (f" ({why_not})" if why_not else "")))
    if streaming:
        _stream(tag_dir, out, written, world, quiet, workers)
    else:
        from recipes.train.state_writer import publish_checkpoint

        state = _read_with_moments(ckpt_dir, recipe, tag)
        publish_checkpoint(out, world, state.weights, state.meta, written, state.exp_avg, state.exp_avg_sq,
                           quiet=quiet)
    _record_target(out, new, world)
    if written is not new:
        from recipes.checkpoint.recipe_file import write_recipe

        write_recipe(new, out)  # the run resumes at the target's cp
    file_mode.fix_tree(out, file_mode.recipe_mode(new))  # checkpoint.file_mode (the partial dir was mkdtemp's 0700)
    log.info(f"reshape: wrote {out}; resume with python -m recipes train ... checkpoint.dir={out} "
        f"parallel.tp={target['tp']} parallel.pp={target['pp']} parallel.cp={new.parallel.cp} "
        + (f"parallel.ep={new.parallel.ep} " if recipe.model.moe is not None else "") +
        f"parallel.zero_stage={new.parallel.zero_stage} "
        f"(world size {world})")
    return out


def _ep_of(recipe) -> str:
    return f" x EP={recipe.parallel.ep}" if recipe.model.moe is not None else ""


def _read_with_moments(ckpt_dir: str, recipe, tag: str | None):
    """The source's full state with Adam's moments: offline from its files, or for a mixture-of-experts model by
    engines at its own layout (where its experts are: recipes.train.state_reader)."""
    if recipe.model.moe is not None:
        from recipes.train.state_reader import read_via_engines

        return read_via_engines(ckpt_dir, recipe, tag=tag, with_moments=True)
    from recipes.checkpoint.format.read import read_full_state

    return read_full_state(ckpt_dir, recipe.model, tag=tag, with_moments=True)


def _record_target(out: Path, new, world: int) -> None:
    """The written tag records the target layout the run resumes at (the writers lay a CP target out as DP x CP
    data ranks; the pre-launch check compares this record with the launch: recipes.checkpoint.relaunch)."""
    from recipes.checkpoint.format import layout_record
    from recipes.checkpoint.format.tags import newest_complete
    from recipes.parallel.layout import Layout

    tag = newest_complete(str(out))
    layout_record.restamp(out / tag, layout_record.record(new, Layout.from_recipe(new, world)))


def _stream(tag_dir: Path, out: Path, new, world: int, quiet: bool, workers: int | None) -> None:
    """Streaming re-layout into a hidden sibling directory, renamed to `out` only when complete (an interrupted
    reshape never leaves anything that looks like a checkpoint)."""
    import os
    import shutil
    import tempfile

    from data_prep.io import fsync_dir
    from recipes.checkpoint.format.relayout import relayout
    from recipes.parallel.layout import Layout

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        figures = relayout(tag_dir, work, new, Layout.from_recipe(new, world), quiet=quiet, workers=workers)
        if out.exists():
            out.rmdir()  # a non-empty out was refused above; an empty one is replaced
        fsync_dir(str(work))  # its recipe file and `latest` (the tag's files and complete.json are fsynced already)
        os.replace(work, out)
        fsync_dir(str(out.parent))  # the rename itself: a crash now must not lose the finished checkpoint
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info(f"reshape: {figures['files']} files, {figures['bytes'] / 2**20:.1f} MiB in {figures['seconds']:.1f} s by "
             f"{figures['workers']} worker(s), peak RSS of a worker {figures['worker_peak_rss'] / 2**20:.0f} MiB")


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got '{value}'")
    return int(value)


EXAMPLES = (  # shown by --help
    "python -m recipes reshape --checkpoint /shared/ckpt/run1 --out /shared/ckpt/run1-dp36 --to tp=4,pp=5,dp=36",
    "python -m recipes reshape --checkpoint runs/tiny --tag global_step6 --out runs/tiny-2x1x4 --to tp=2,pp=1,dp=4",
    "python -m recipes train --config runs/tiny-2x1x4/recipe.yaml --local 8 checkpoint.dir=runs/tiny-2x1x4"
    "   # resume there",
)


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m recipes reshape", __doc__, EXAMPLES)
    ap.add_argument("--checkpoint", required=True, help="source training checkpoint directory")
    ap.add_argument("--tag", help="global_stepN (default: the `latest` file)")
    ap.add_argument("--out", required=True, help="new checkpoint directory (becomes checkpoint.dir of the resumed run)")
    ap.add_argument("--to", required=True, help="target layout, e.g. tp=1,pp=4,dp=2[,cp=2][,ep=2][,zero=1] (cp "
                    "default 1, ep default the source's)")
    ap.add_argument("--config", help="the run's recipe (default: CHECKPOINT/recipe.yaml)")
    ap.add_argument("--writer", choices=("auto", "stream", "engine"), default="auto",
                    help="stream: tensor by tensor, no engine (ZeRO-1/2 to ZeRO-1/2); engine: one process per target "
                         "rank; auto (default): stream where it applies")
    ap.add_argument("--workers", type=_positive, help="processes of the streaming writer, each writing whole (pipeline "
                    "stage, TP rank) items (default: one per core, at most one per item)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("overrides", nargs="*", help="section.key=value overrides the run used")
    ns = ap.parse_args(argv)
    cpu_only_workers()  # its engine ranks run on CPU: forked from here when no GPU is visible (local_workers)
    setup_logging(quiet=ns.quiet)
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
    from recipes.checkpoint.format.errors import CheckpointError
    from recipes.checkpoint.recipe_file import load_checkpoint_recipe

    try:
        recipe = load_checkpoint_recipe(ns.checkpoint, ns.config, ns.overrides)
        file_mode.apply_recipe_mode(recipe)  # the writer processes inherit it
        reshape(ns.checkpoint, ns.out, recipe, parse_target(ns.to), tag=ns.tag, quiet=ns.quiet, writer=ns.writer,
                workers=ns.workers)
    except (RecipeError, CheckpointError, FileExistsError, RuntimeError) as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())

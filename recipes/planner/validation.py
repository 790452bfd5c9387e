"""Cross-field rules of a recipe, checked before anything starts.

`validate(recipe)` raises one `RecipeError` that lists EVERY error (each names the field, the values and a fix) and
returns the warnings (beginner mistakes that still run). Types, ranges, unknown keys and YAML syntax are checked
earlier by `recipes.config.loading`.

`validate_for_launch(recipe, world_size)` is what every path that starts ranks asks first (`recipes train`, `recipes
render`, the launcher): the rules above plus what a run needs to start at all: a train length, its data (manifests
present and readable, shards on disk, a vocabulary that fits, see `recipes.planner.data_checks`) and, for a run
predicted to take more than an hour, a checkpoint directory; a checkpoint.dir whose checkpoint was saved at another
layout (with the `recipes reshape` command to run) and a checkpoint.init_from that is missing or does not fit. It
returns the problems; `launch_refusal` formats them.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from pathlib import Path

from recipes.checkpoint.format.layout_record import SHAPE_FIELDS, marker, model_shape
from recipes.checkpoint.format.tags import newest_complete
from recipes.checkpoint.init_from import init_from_refusals
from recipes.checkpoint.relaunch import relaunch_refusals
from recipes.parallel.layout import Layout, resolve_layout
from recipes.config.loading import RecipeError
from recipes.config.shape_rules import shape_problems
from recipes.planner.assumptions import Assumptions
from recipes.planner.calibration import assumptions_for
from recipes.planner.cost import device_memory, estimate, format_memory
from recipes.planner.search import CP_SEARCH_FROM
from recipes.config.problem import Problem
from recipes.planner.data_checks import data_problems
from recipes.planner.path_checks import path_problems
from recipes.planner.units import format_duration

LARGE_BATCH_TOKENS = 2**19  # ~0.5M tokens per step: large enough that skipping warmup risks early divergence


@dataclass(frozen=True)
class RecipeWarning:
    field: str
    message: str
    level: str = "warning"  # "warning" or "info"

    def __str__(self) -> str:
        return f"{self.level}: {self.field}: {self.message}"


def validate(recipe, world_size: int | None = None) -> list[RecipeWarning]:
    """Check the recipe's cross-field rules for `world_size` GPUs (default: the cluster's). Raise `RecipeError`
    listing all errors; return warnings and informational notes."""
    errors, warnings = cross_field(recipe, world_size)
    if errors:
        raise RecipeError(f"recipe '{recipe.name}' has {len(errors)} error(s):\n"
                          + "\n".join(f"  - {e}" for e in errors))
    return warnings


def cross_field(recipe, world_size: int | None = None) -> tuple[list[str], list[RecipeWarning]]:
    """(errors, warnings) of the recipe's cross-field rules for `world_size` GPUs (default: the cluster's)."""
    errors: list[str] = []
    warnings: list[RecipeWarning] = []
    m, par, tr, cl = recipe.model, recipe.parallel, recipe.training, recipe.cluster
    world = world_size if world_size is not None else cl.world_size
    tp = par.tp

    # --- model shapes the kernels cannot run (recipes.config.shape_rules) ----------------------------------------------
    errors += shape_problems(recipe)
    padded = m.padded_vocab_size(tp)
    if padded != m.vocab_size:
        warnings.append(RecipeWarning(
            "model.vocab_size", f"{m.vocab_size} is padded to {padded} (a multiple of "
            f"make_vocab_size_divisible_by x tp = {m.make_vocab_size_divisible_by} x {tp}); Megatron does this "
            f"automatically, the {padded - m.vocab_size} extra rows are never a target", level="info"))

    # --- the parallel layout: its rules live in Layout ---------------------------------------------------------------
    source = None if world_size is None else "the ranks launched"
    layout, problems = resolve_layout(recipe, world, world_source=source, max_tp=cl.gpus_per_node)
    errors += [str(p) for p in problems]

    # --- precision ---------------------------------------------------------------------------------------------------
    if tr.precision == "fp16" and tr.loss_scale is None:
        errors.append("training.precision=fp16 without training.loss_scale: fp16 gradients underflow without loss "
                      "scaling; set training.loss_scale=0 (dynamic, recommended) or a power of two, or use bf16")

    # --- warnings: beginner mistakes that still run -------------------------------------------------------------------
    ref_b = tr.reference_global_batch
    if ref_b and tr.global_batch != ref_b:
        ratio = tr.global_batch / ref_b
        if tr.reference_lr is None or abs(tr.optimizer.lr - tr.reference_lr) <= 1e-12 * tr.reference_lr:
            base = tr.reference_lr or tr.optimizer.lr
            warnings.append(RecipeWarning(
                "training.optimizer.lr", f"global_batch changed from the preset's {ref_b} to {tr.global_batch} but "
                f"lr is still {tr.optimizer.lr:g}; rescale it (Adam: x sqrt({ratio:g}) -> lr={base * ratio ** 0.5:.3g};"
                f" linear rule: lr={base * ratio:.3g})"))
    tokens_per_step = tr.global_batch * m.seq_length
    if tr.schedule.warmup_steps == 0 and tokens_per_step >= LARGE_BATCH_TOKENS:
        warnings.append(RecipeWarning(
            "training.schedule.warmup_steps", f"0 with a large batch ({tr.global_batch} x {m.seq_length} = "
            f"{tokens_per_step:,} tokens per step): Adam diverges early without warmup; use e.g. warmup_steps="
            f"{max(100, min(2000, 375_000_000 // tokens_per_step))} (~375M tokens, as GPT-3)"))
    if tp > cl.gpus_per_node:
        warnings.append(RecipeWarning(
            "parallel.tp", f"{tp} > cluster.gpus_per_node={cl.gpus_per_node}: tensor-parallel all-reduces (4 per "
            f"layer per micro-batch) would cross InfiniBand; keep tp <= {cl.gpus_per_node} and use pp for the rest"))

    # --- memory: only for GPU clusters with a well-formed layout --------------------------------------------------------
    if not errors and cl.device == "cuda" and layout is not None:
        errors_m, warnings_m = memory_check(recipe, layout)
        errors += errors_m
        warnings += warnings_m
    return errors, warnings


def memory_check(recipe, layout: Layout) -> tuple[list[str], list[RecipeWarning]]:
    """Predicted memory per GPU over the device (an error) or inside the headroom (a warning), at `layout` (the
    launcher asks it at the world it starts)."""
    m, cl, tr = recipe.model, recipe.cluster, recipe.training
    est = estimate(m, cl, layout, tr.global_batch, precision=tr.precision)
    if est.memory_verdict in ("maybe", "over"):
        lean = ("" if est.memory_verdict == "over" else
                f" (this trainer keeps every tensor a layer saves, Korthikanti's count; a stack that remakes the norm "
                f"outputs and the activation function in the backward would need {est.memory_gib['total_lean']:.1f} "
                "GiB)")
        return [f"predicted memory per GPU {est.memory_gib['total']:.1f} GiB exceeds cluster.gpu_memory_gb="
                f"{cl.gpu_memory_gb:g} ({device_memory(cl)}) for {layout.describe()}: {format_memory(est.memory_gib)}"
                f"{lean}; " + _memory_fixes(recipe, layout)], []
    if est.tight:
        return [], [RecipeWarning(
            "parallel", f"predicted memory per GPU {est.memory_gib['total']:.1f} GiB for {layout.describe()} fits the "
            f"{device_memory(cl)} but not the {est.memory_budget_gib:.1f} GiB budget that leaves "
            f"{Assumptions().memory_headroom:.0%} headroom: an allocator peak can still run out; "
            + _memory_fixes(recipe, layout, headroom=True))]
    return [], []


def _memory_fixes(recipe, layout: Layout, headroom: bool = False) -> str:
    """Try the usual single changes and report the ones that would fit (with the headroom, when asked), with their
    predicted totals."""
    from dataclasses import replace

    m, cl, tr = recipe.model, recipe.cluster, recipe.training
    tries = []
    if layout.micro_batch > 1:
        tries.append(("parallel.micro_batch=1", replace(layout, micro_batch=1)))
    if layout.recompute != "full":
        tries.append(("parallel.recompute=full", replace(layout, recompute="full")))
    if layout.pp == 1 and layout.zero_stage < 3:
        tries.append(("parallel.zero_stage=3", replace(layout, zero_stage=3)))
    if layout.pp > 1 and layout.zero_stage == 0:
        tries.append(("parallel.zero_stage=1", replace(layout, zero_stage=1)))
    if layout.tp > 1 and not layout.sequence_parallel:
        tries.append(("parallel.sequence_parallel=true", replace(layout, sequence_parallel=True)))
    tries += _context_parallel_tries(recipe, layout)
    fits = []
    for label, lay in tries:
        if lay.problems(m, tr.global_batch):
            continue
        e = estimate(m, cl, lay, tr.global_batch, precision=tr.precision, assume=Assumptions())
        if e.fits_with_headroom if headroom else e.memory_verdict in ("fits", "tight"):
            fits.append(f"{label} ({e.memory_gib['total']:.1f} GiB)")
    if fits:
        return "these single changes would fit: " + ", ".join(fits)
    return ("no single change (micro_batch=1, recompute=full, ZeRO-3, SP, a higher cp) fits; more GPUs, more "
            "tp/pp, or run `python -m recipes plan` on this recipe to search all layouts")


def _context_parallel_tries(recipe, layout: Layout) -> list[tuple[str, Layout]]:
    """From CP_SEARCH_FROM tokens: the same GPUs with 2x, 4x, 8x the CP degree (DP gives up the ranks), which divides
    every layer's activations."""
    from dataclasses import replace

    if recipe.model.seq_length < CP_SEARCH_FROM:
        return []
    out = []
    for f in (2, 4, 8):
        if layout.dp % f:
            break
        lay = replace(layout, cp=layout.cp * f, dp=layout.dp // f)
        dp = f" parallel.dp={lay.dp}" if recipe.parallel.dp is not None else ""
        out.append((f"parallel.cp={lay.cp}{dp}", lay))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Before launch: everything a run needs to start
# ---------------------------------------------------------------------------------------------------------------------

CHECKPOINT_REQUIRED_AFTER_S = 3600  # a run longer than this without checkpoint.dir is refused (unless opted out)


def train_length_problems(recipe) -> list[Problem]:
    tr = recipe.training
    if tr.train_steps or tr.train_tokens:
        return []
    return [Problem("training.train_tokens", "training: the recipe sets no train length (training.train_tokens and "
                    "training.train_steps are both empty)", "set training.train_tokens=N (e.g. 2e12 written out: "
                    "2000000000000) or training.train_steps=N; `recipes plan ... --tokens N --write-recipe F` writes "
                    "it")]


def tracking_problems(recipe) -> list[Problem]:
    """A tracker the recipe configures but this environment lacks: refused before any rank starts (each rank would
    otherwise fail at its first log line, after the slow start-up)."""
    if recipe.logging.wandb is None or importlib.util.find_spec("wandb") is not None:
        return []
    return [Problem("logging.wandb", "logging.wandb is set but the wandb package is not installed",
                    "install the extra: pip install '.[wandb]' (or remove logging.wandb)")]


def checkpoint_problems(recipe, layout: Layout | None) -> list[Problem]:
    """No checkpoint.dir on a run predicted to take more than an hour: a failure would lose all of it."""
    ck, tr, m, cl = recipe.checkpoint, recipe.training, recipe.model, recipe.cluster
    if ck.dir or not ck.require_dir or layout is None or not (tr.train_steps or tr.train_tokens):
        return []
    steps = tr.steps(m.seq_length)
    assume, _ = assumptions_for(cl, Assumptions.for_device(cl.device))  # the cluster's calibration, as `plan` prices
    step_s = estimate(m, cl, layout, tr.global_batch, precision=tr.precision, assume=assume).time_s["step"]
    if steps * step_s <= CHECKPOINT_REQUIRED_AFTER_S:
        return []
    return [Problem("checkpoint.dir", f"checkpoint.dir: not set, and this run is predicted to take "
                    f"{format_duration(steps * step_s)} ({steps:,} steps x {step_s:.2f} s at {layout.describe()}, "
                    f"{cl.gpu}): a failure would lose all of it",
                    "set checkpoint.dir=DIR (a directory every node sees) and checkpoint.save_interval=N (`recipes "
                    "plan ... --checkpoint-dir DIR --write-recipe F` sets both), or checkpoint.require_dir=false to "
                    "run without checkpoints")]


def validate_for_launch(recipe, world_size: int | None = None) -> list[Problem]:
    """Every reason `recipe` cannot start on `world_size` ranks (default: its cluster's), as `Problem`s naming the
    field or file and the fix; empty when it can. Reads the data manifests (not the shards' contents); starts nothing.
    The launcher, `recipes train` and `recipes render` call this before any rank exists."""
    errors, _ = cross_field(recipe, world_size)
    problems = [Problem("recipe", e) for e in errors]
    problems += train_length_problems(recipe)
    problems += data_problems(recipe)
    problems += path_problems(recipe)
    problems += tracking_problems(recipe)
    if not errors:
        layout, _ = resolve_layout(recipe, world_size)
        problems += checkpoint_problems(recipe, layout)
        problems += saved_checkpoint_problems(recipe, layout)
    return problems


def saved_checkpoint_problems(recipe, layout: Layout) -> list[Problem]:
    """The checkpoints a start would load: checkpoint.dir's newest complete tag of another model (its complete.json
    records the shape) or saved at another layout than this launch's (recipes.checkpoint.relaunch: the reshape
    command to run), and a checkpoint.init_from that is missing or does not fit the model
    (recipes.checkpoint.init_from)."""
    shape = resume_shape_problems(recipe)
    refusals = ([] if shape else relaunch_refusals(recipe, layout)) + init_from_refusals(recipe)
    return shape + [Problem(r.field, r.message, r.fix) for r in refusals]


# The recipe key a user sets for each recorded shape field (the record names some by their derived property)
_SHAPE_KEY = {"query_groups": "num_query_groups", "ffn_size": "ffn_hidden_size", "qkv_bias": "add_qkv_bias"}


def resume_shape_problems(recipe) -> list[Problem]:
    """checkpoint.dir's newest complete tag holds a model of another shape than the recipe's (a resume would load
    weights of other sizes: DeepSpeed's 100-line size-mismatch error after every rank started). One problem naming
    every differing field with both values; a layout reshape cannot help, so it is said instead of the layout's."""
    c = recipe.checkpoint
    if not c.dir or not c.auto_resume:
        return []
    tag = newest_complete(c.dir)
    theirs = marker(Path(c.dir) / tag).get("model") if tag else None
    if not isinstance(theirs, dict):  # nothing to resume, or a tag from before the record: DeepSpeed's load decides
        return []
    ours = model_shape(recipe.model)
    diff = [(f"model.{_SHAPE_KEY.get(f, f)}", theirs[f], ours[f]) for f in SHAPE_FIELDS
            if f in theirs and theirs[f] != ours[f]]
    if not diff:
        return []
    saved = ", ".join(f"{k}={a}" for k, a, _ in diff)
    here = ", ".join(f"{k}={b}" for k, _, b in diff)
    return [Problem(diff[0][0], f"checkpoint.dir = {c.dir} holds {tag} of another model ({saved}); this recipe has "
                    f"{here}: its weights do not fit this model",
                    f"resume with the checkpoint's model (set {saved}), or train this model in a new "
                    "checkpoint.dir (checkpoint.init_from cannot change a model's shape either)")]


def launch_refusal(recipe, problems: list[Problem]) -> str:
    """The message a refused launch prints (one problem per line, each with its fix)."""
    head = f"recipe '{recipe.name}' cannot start: {len(problems)} problem(s)" if len(problems) > 1 else \
        f"recipe '{recipe.name}' cannot start"
    return head + ":\n" + "\n".join(f"  - {p}" for p in problems)


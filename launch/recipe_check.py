"""Before any process starts: the recipe checked for the world the launch will start, and the recipe's facts the
launcher acts on (device, checkpoint dir, data paths, supervision settings, the stop grace).

In order, each refusal one message with its fix:
  1. the layout at this world size (the rules are Layout.problems', recipes/parallel/layout.py): exit 3;
  2. predicted memory per GPU at this world (the planner's, recipes/planner/cost.py): over the device, exit 3 naming
     `recipes plan` for this world and `recipes reshape` for the run's checkpoints; inside the headroom, a warning;
  3. everything else a start needs (recipes.planner.validation.validate_for_launch: a train length, the data, the
     tokenizer's vocabulary, a checkpoint.dir on a long run): exit 2 — for the default entry (`recipes train`);
     another --entry program gets only the recipe's cross-field rules, its data being its own business.
A world that differs from the recipe's cluster (nodes x gpus_per_node) is said in the plan: how DP, the micro-batches
per step and the tokens per DP rank change. Paths are as the ranks see them: they run in the repository."""
from __future__ import annotations

import contextlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from launch.common import REPO_DIR, LaunchError
from recipes.config.loading import RecipeError, load_recipe
from recipes.parallel.layout import Layout, resolve_layout
from recipes.planner.validation import cross_field, launch_refusal, memory_check, validate_for_launch


@dataclass
class Facts:
    layout: str                      # "TP=.. x PP=.. x DP=.., ZeRO-.."
    device: str = "cpu"
    checkpoint_dir: str = ""         # absolute, "" when the recipe saves nothing
    data_paths: list[str] = field(default_factory=list)
    max_restarts: int = 0
    backoff_s: float = 10.0
    backoff_max_s: float = 300.0
    hang_timeout_s: float = 0.0      # 0: no hang watchdog
    stop_grace_s: float = 60         # a stop's wait for the ranks' save (LAUNCH_STOP_GRACE overrides it)
    notes: list[str] = field(default_factory=list)  # printed with the plan: the world's change, memory warnings


@dataclass(frozen=True)
class World:
    """The world the launch starts: its size, nodes and ranks per node, and where that came from (for messages)."""
    size: int
    nodes: int
    per_node: int | None             # None when the nodes differ (DeepSpeed copes with uneven hostfiles)
    source: str                      # "the hostfile selection", "--nodes 2 x --gpus-per-node 8"


def _as_ranks_see(path: str) -> str:
    return str(REPO_DIR / path) if path and not Path(path).is_absolute() and "://" not in path else path


def load(recipe_path: str, overrides: list[str]):
    try:
        return load_recipe(recipe_path, overrides)
    except (RecipeError, ValueError) as e:
        raise LaunchError(f"recipe error: {e}", 2) from None


def runs_trainer(entry: str) -> bool:
    """Whether the per-rank program is this repository's trainer (`python -m recipes train`, `llm-recipes train`)."""
    words = entry.split()
    return any(words[i:i + 2] == ["recipes", "train"] for i in range(len(words))) or \
        any(w.endswith("llm-recipes") and words[i + 1:i + 2] == ["train"] for i, w in enumerate(words))


@contextlib.contextmanager
def _in_repo():
    """The ranks run in the repository: relative data and checkpoint paths are judged from there."""
    before = os.getcwd()
    os.chdir(REPO_DIR)
    try:
        yield
    finally:
        os.chdir(before)


def check(recipe, recipe_path: str, world: World, overrides: list[str], entry: str) -> Facts:
    """The recipe's facts at this world; LaunchError (exit 3 layout and memory, exit 2 the rest) listing every
    problem with its fix."""
    notes = world_change(recipe, world)
    layout, problems = resolve_layout(recipe, world.size, world_source=world.source)
    if problems:
        raise LaunchError(f"world size check failed: {recipe_path}: " + "\n  ".join(
            [*notes, *(f"{p.message}. Fix: {p.fix}" for p in problems)])
            + "\n(overrides go on the command line after --, e.g. parallel.tp=...)", 3)
    notes += _memory(recipe, recipe_path, layout, world, overrides)
    with _in_repo():
        if runs_trainer(entry):
            found = validate_for_launch(recipe, world.size)
        else:
            found = [f"recipe: {e}" for e in cross_field(recipe, world.size)[0]]
            notes.append(f"entry '{entry}' is not `recipes train`: the recipe's data, train length and checkpoint "
                         "directory are not checked (the program's own business)")
    if found:
        raise LaunchError(launch_refusal(recipe, found) if runs_trainer(entry) else
                          f"recipe '{recipe.name}' cannot start:\n" + "\n".join(f"  - {p}" for p in found), 2)
    if runs_trainer(entry):
        notes += finished_run_note(recipe)
    return _facts(recipe, layout, notes)


def finished_run_note(recipe) -> list[str]:
    """A relaunch over a checkpoint already at the recipe's last step trains nothing (a documented continuation once
    did, silently): said in the plan with the length to raise. Not a refusal: rerunning a finished run is harmless."""
    from recipes.checkpoint.format.tags import step_of
    from recipes.checkpoint.store import newest_complete

    c, tr = recipe.checkpoint, recipe.training
    if not c.dir or not c.auto_resume or not (tr.train_steps or tr.train_tokens):
        return []
    with _in_repo():
        tag = newest_complete(c.dir)
    step, last = step_of(tag) if tag else None, tr.steps(recipe.model.seq_length)
    if step is None or step < last:
        return []
    return [f"checkpoint: {c.dir} holds {tag}, the recipe's last step ({last}): this launch trains nothing; to "
            f"continue, raise the length (e.g. -- training.train_steps={step + last})"]


def _facts(recipe, layout: Layout, notes: list[str]) -> Facts:
    sv = recipe.supervision
    return Facts(layout=layout.describe(), device=recipe.cluster.device,
                 checkpoint_dir=_as_ranks_see(recipe.checkpoint.dir or ""),
                 data_paths=[_as_ranks_see(str(m)) for m in recipe.data.manifests]
                 + [_as_ranks_see(str(prefix)) for _, prefix in recipe.data.blend],
                 max_restarts=sv.max_restarts, backoff_s=sv.restart_backoff_seconds,
                 backoff_max_s=sv.restart_backoff_max_seconds, hang_timeout_s=sv.hang_timeout_seconds or 0,
                 stop_grace_s=recipe.checkpoint.stop_grace_seconds, notes=notes)


def world_change(recipe, world: World) -> list[str]:
    """How the run differs from the recipe's own cluster (nodes x gpus_per_node) when the world differs: DP, the
    micro-batches per step on each DP rank, the tokens per step (fixed by the global batch) and per DP rank."""
    cl, par, tr, seq = recipe.cluster, recipe.parallel, recipe.training, recipe.model.seq_length
    planned = cl.nodes * cl.gpus_per_node
    if world.size == planned:
        return []
    mp, gb, mb = par.tp * par.pp, tr.global_batch, par.micro_batch
    head = (f"world: {world.size} ranks ({world.source}), not the recipe's cluster.nodes x gpus_per_node = "
            f"{cl.nodes} x {cl.gpus_per_node} = {planned}")
    if par.dp is not None or world.size % mp or planned % mp:
        return [head]  # parallel.dp fixed, or a world TP x PP does not divide: the layout check says why

    def per_step(dp: int) -> str:
        return f"{gb // (mb * dp)}" if gb % (mb * dp) == 0 else f"{gb / (mb * dp):g} (not whole)"

    dp0, dp1 = planned // mp, world.size // mp
    return [f"{head}: DP {dp0} -> {dp1}; micro-batches per step on each DP rank {per_step(dp0)} -> {per_step(dp1)} "
            f"(global batch {gb} = micro-batch {mb} x DP x micro-batches); tokens per step stay {gb * seq:,} "
            f"(global batch x seq_length), per DP rank {gb * seq // dp0:,} -> {gb * seq / dp1:,.0f}"]


def _memory(recipe, recipe_path: str, layout: Layout, world: World, overrides: list[str]) -> list[str]:
    """The planner's memory per GPU at this world: a refusal over the device (exit 3), a note inside the headroom."""
    errors, warnings = memory_check(recipe, layout) if recipe.cluster.device == "cuda" else ([], [])
    if errors:
        raise LaunchError(f"memory check failed for {world.size} ranks ({world.source}): {errors[0]}\n"
                          + _plan_and_reshape(recipe, recipe_path, layout, world, overrides), 3)
    return [f"memory: {w.message}" for w in warnings]


def _plan_and_reshape(recipe, recipe_path: str, layout: Layout, world: World, overrides: list[str]) -> str:
    nodes = f"--nodes {world.nodes} --gpus-per-node {world.per_node}" if world.per_node else \
        f"--nodes {world.nodes} (and --gpus-per-node)"
    plan = shlex.join(["python", "-m", "recipes", "plan", recipe_path, *overrides]) + f" {nodes}"
    ckpt = _as_ranks_see(recipe.checkpoint.dir or "") or "CHECKPOINT_DIR"
    return (f"  choose a layout that fits this world: `{plan}`; then set the parallel.* keys it prints (after --), "
            f"and move this run's checkpoints to that layout with `python -m recipes reshape --checkpoint {ckpt} "
            f"--out NEW_DIR --to tp=T,pp=P,dp=D` (continue with checkpoint.dir=NEW_DIR)")

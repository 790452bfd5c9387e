"""Start a run from another run's checkpoint (`checkpoint.init_from`): a long-context stage continuing a short-context
run, continued pretraining from your own run. Every rank reads, tensor by tensor, the parameters its engine holds
from the source at whatever layout the source was saved (TP x CP x PP x DP, ZeRO-1/2 streamed from memory-mapped
partitions, recipes.checkpoint.format.relayout.Source; ZeRO-0/3 read whole, recipes.checkpoint.format.read), cuts
its own TP shard, re-pads the vocabulary and puts weights, fp32 masters and (with `optimizer`) Adam's moments and
step count where DeepSpeed keeps them (recipes.checkpoint.format.engine_state). The new run's step, consumed samples
and lr schedule start at zero; the source (dir, tag, step, its recipe's name and sha256) is recorded in the new
run's checkpoints (client_state["init_from"]).
Mixture-of-experts sources are read the same way at any EP (the routed experts' partitions of each expert shard from
the DP ranks of its expert-data-parallel group, recipes.checkpoint.format.relayout.Source; their TP split:
recipes.checkpoint.format.expert_shards), into a run at any EP (each rank cuts its experts).

Only while checkpoint.dir holds no complete checkpoint: after the first save the run resumes its own
(recipes.train.resume). Before any rank starts, `init_from_refusals` checks the source is there and fits the model.

Why weights only by default: the new stage's schedule warms up from zero with fresh moments, as Llama 3's
long-context stages and most continued-pretraining recipes do; the moments of the source's last steps belong to its
data and its (decayed) lr. `optimizer: true` carries them with Adam's step count, so the bias correction stays the
source's (moments carried with the count reset would be scaled up ~10x at the first step).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from recipes.checkpoint.format.errors import CheckpointError
from recipes.checkpoint.format.layout_record import SHAPE_FIELDS, marker, model_shape, saved_layout
from recipes.checkpoint.format.tags import client_state, newest_complete, resolve_tag, step_of, tag_for
from recipes.checkpoint.recipe_file import RECIPE_FILE
from recipes.config.problem import Problem

log = logging.getLogger(__name__)

# SHAPE_FIELDS -> the recipe key a user sets
_RECIPE_KEY = {"query_groups": "num_query_groups", "ffn_size": "ffn_hidden_size", "qkv_bias": "add_qkv_bias"}


def applies(recipe) -> bool:
    """init_from is set and checkpoint.dir holds nothing to resume (a restart resumes its own checkpoints)."""
    c = recipe.checkpoint
    if c.init_from is None:
        return False
    return not (c.dir and c.auto_resume and newest_complete(c.dir))


# ------------------------------------------------------------------------------------------------ before launch
def init_from_refusals(recipe) -> list[Problem]:
    """Why `recipe` cannot start from its checkpoint.init_from ([] if it can, or if it resumes its own checkpoint)."""
    if not applies(recipe):
        return []
    src, c = recipe.checkpoint.init_from, recipe.checkpoint
    if c.dir and _same_dir(src.dir, c.dir):
        return [Problem("checkpoint.init_from.dir", f"checkpoint.init_from.dir = {src.dir} is this run's own "
                        "checkpoint.dir", "a run continues its own checkpoints by itself (auto_resume); for a new "
                        "stage give it a new checkpoint.dir")]
    try:
        tag_dir = resolve_tag(src.dir, src.tag)
        saved = saved_layout(tag_dir)
    except CheckpointError as e:
        return [Problem("checkpoint.init_from.dir", f"checkpoint.init_from = {src.dir}: {e}",
                        "point checkpoint.init_from.dir at the source run's checkpoint.dir and "
                        "checkpoint.init_from.tag at one of its complete tags (default: its `latest`)")]
    out = _shape_refusals(tag_dir, recipe.model)
    if recipe.parallel.zero_stage == 3:
        out.append(Problem("parallel.zero_stage", "checkpoint.init_from puts the source's tensors into a ZeRO-0/1/2 "
                           "engine; parallel.zero_stage=3 partitions each parameter where that cannot reach it yet",
                           "start this run at parallel.zero_stage=1 or 2 (or reshape the source with `python -m "
                           "recipes reshape` and resume it as ZeRO-1/2)"))
    if src.optimizer and saved.zero_stage == 0:
        out.append(Problem("checkpoint.init_from.optimizer", f"checkpoint.init_from.optimizer = true but {tag_dir} "
                           "is a ZeRO-0 checkpoint, whose optimizer state torch keeps without parameter names",
                           "carry the weights only (checkpoint.init_from.optimizer=false)"))
    return out


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def source_model(tag_dir: Path) -> dict | None:
    """The model shape the source tag records, else its run's stored recipe's (a tag from before the record)."""
    shape = marker(tag_dir).get("model")
    if isinstance(shape, dict):
        return shape
    stored = tag_dir.parent / RECIPE_FILE
    if not stored.is_file():
        return None
    from recipes.config.loading import RecipeError, load_recipe

    try:
        return model_shape(load_recipe(str(stored), []).model)
    except (RecipeError, ValueError):
        return None


def _shape_refusals(tag_dir: Path, model_cfg) -> list[Problem]:
    theirs = source_model(tag_dir)
    if theirs is None:
        log.warning(f"checkpoint.init_from: {tag_dir} records no model shape and {tag_dir.parent / RECIPE_FILE} is "
                    "missing: the shapes are checked when the ranks read it")
        return []
    ours = model_shape(model_cfg)
    out = []
    for f in SHAPE_FIELDS:
        if f in theirs and theirs[f] != ours[f]:
            key = f"model.{_RECIPE_KEY.get(f, f)}"
            out.append(Problem(key, f"checkpoint.init_from: {tag_dir} holds a model with {key}={theirs[f]}; this "
                               f"recipe has {key}={ours[f]}: its weights do not fit this model",
                               f"set {key}={theirs[f]} (the source's), or start from a checkpoint of this model"))
    seq = saved_layout(tag_dir).seq_length
    if model_cfg.position_embedding == "learned" and seq is not None and seq != model_cfg.seq_length:
        out.append(Problem("model.seq_length", f"checkpoint.init_from: {tag_dir} holds a learned position table of "
                           f"{seq} positions; this recipe has model.seq_length={model_cfg.seq_length}",
                           f"set model.seq_length={seq}; a longer context needs RoPE (model.position_embedding=rope)"))
    return out


# ------------------------------------------------------------------------------------------------- on the ranks
class _Tensors:
    """One kind of tensor of a source ("fp32" weights, "exp_avg", "exp_avg_sq") by canonical name, one at a time:
    what recipes.checkpoint.format.engine_state reads (`keys`, `get_tensor`)."""

    def __init__(self, names, get):
        self._names, self._get = list(names), get

    def keys(self):
        return self._names

    def get_tensor(self, name: str):
        return self._get(name)


def open_source(tag_dir: Path, model_cfg, moments: bool):
    """The source tag as an OpenFullState: streamed from a ZeRO-1/2 checkpoint, else read whole."""
    from recipes.checkpoint.format.full_state import OpenFullState

    lay = saved_layout(tag_dir)
    if lay.zero_stage in (1, 2):
        from recipes.checkpoint.format.relayout import Source

        src = Source(tag_dir, model_cfg)

        def kind(k):
            def get(name):
                t = src.full(name, k)
                src.release()  # only one tensor's pages held at a time
                return t
            return _Tensors(list(src.index) + (list(src.buffers) if k == "fp32" else []), get)

        step = float(src.step) if src.step is not None else None
        return OpenFullState(weights=kind("fp32"), moments=(kind("exp_avg"), kind("exp_avg_sq")) if moments else None,
                             meta={"optimizer_step": step})
    from recipes.checkpoint.format.read import read_full_state

    full = read_full_state(tag_dir.parent, model_cfg, tag=tag_dir.name, with_moments=moments)
    pick = lambda d: _Tensors(d, d.__getitem__)  # noqa: E731
    return OpenFullState(weights=pick(full.weights),
                         moments=(pick(full.exp_avg), pick(full.exp_avg_sq)) if moments else None,
                         meta={"optimizer_step": full.meta.get("optimizer_step")})


def source_tag(src) -> Path:
    """Collective: the source tag every rank reads (checkpoint.init_from.tag, else the source's `latest` as rank 0
    finds it: a source run still saving cannot hand the ranks different tags)."""
    from recipes.checkpoint.store import agreed_step

    if src.tag:
        return resolve_tag(src.dir, src.tag)
    def latest() -> int:
        found = step_of(resolve_tag(src.dir).name)
        return -1 if found is None else found

    step = agreed_step(latest)
    if step < 0:
        raise CheckpointError(f"checkpoint.init_from = {src.dir}: its `latest` names no global_stepN tag; set "
                              "checkpoint.init_from.tag")
    return resolve_tag(src.dir, tag_for(step))


def initialise(eng, recipe, tp_rank: int, ep_rank: int = 0) -> dict:
    """Collective (every rank, before the first step): this rank's part of the source into `eng`
    (recipes.train.engine.Engine; ep_rank: its expert shard). Returns the source's record for the new run's
    checkpoints."""
    from recipes.checkpoint.format.engine_state import install_full_state

    src = recipe.checkpoint.init_from
    tag_dir = source_tag(src)
    install_full_state(eng, recipe, open_source(tag_dir, recipe.model, src.optimizer), tp_rank, ep_rank,
                       schedule=False)
    return source_record(tag_dir, src.optimizer)


def source_record(tag_dir: Path, optimizer: bool) -> dict:
    """Where the run came from: the source's directory, tag, step, layout and recipe (name, sha256 of the resolved
    recipe)."""
    from recipes.checkpoint.recipe_file import recipe_digest

    recipe = marker(tag_dir).get("recipe")
    if not isinstance(recipe, dict):  # a tag from before the record: its run's stored recipe
        stored = tag_dir.parent / RECIPE_FILE
        recipe = None
        if stored.is_file():
            from recipes.config.loading import load_recipe

            r = load_recipe(str(stored), [])
            recipe = {"name": r.name, "sha256": recipe_digest(r)}
    return {"dir": os.path.realpath(tag_dir.parent), "tag": tag_dir.name,
            "step": client_state(tag_dir).get("step", step_of(tag_dir.name)), "layout": saved_layout(tag_dir).record(),
            "recipe": recipe, "optimizer": optimizer}

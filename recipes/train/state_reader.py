"""Read a training checkpoint into the canonical full state through engines built at the checkpoint's own layout:
DeepSpeed loads its own files (any ZeRO stage, pipeline and expert partitioning it wrote reads back as it resumes),
then every rank's parameters are gathered over TP (and EP for the experts) into full tensors, one file per pipeline
stage, joined by the caller. The mirror image of `recipes.train.state_writer`.

Export and reshape use it for MoE checkpoints: `recipes.checkpoint.format.read` reads DeepSpeed's files offline but
knows neither the experts' split (TP x EP, recipes.checkpoint.format.expert_shards) nor where expert parallelism put
them (each EP rank's experts live only in its own ZeRO partitions, over the expert-data-parallel group). Weights are
the fp32 masters (exact, whatever the training precision), with `--moments` also Adam's moments, gathered by
DeepSpeed from each parameter's own DP group (recipes.checkpoint.format.engine_state.gather_full_state). A
context-parallel run
is read as DP x CP data ranks at cp = 1 (its files are those of that layout: DeepSpeed's data axis is DP x CP, and
the expert shard of data rank x is x % ep either way, recipes.parallel.layout).

    python -m recipes.train.state_reader --recipe RECIPE.yaml --checkpoint DIR --tag TAG --out PARTS_DIR [--moments]  (each rank)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from collections import OrderedDict
from pathlib import Path

import torch

from recipes.checkpoint.format.engine_state import KINDS
from recipes.checkpoint.format.errors import CheckpointError
from recipes.checkpoint.format.layout_record import saved_layout
from recipes.checkpoint.format.read import FullState, checkpoint_meta, detect_layout, resolve_tag
from recipes.checkpoint.recipe_file import RECIPE_FILE, write_recipe


def read_full_weights(ckpt_dir: str | Path, recipe, tag: str | None = None, timeout: int = 1800) -> FullState:
    """The checkpoint's full weights (canonical names, fp32, vocabulary unpadded) and its meta, like
    recipes.checkpoint.format.read.read_full_state, read by one local CPU process per rank of the checkpoint's
    layout."""
    return read_via_engines(ckpt_dir, recipe, tag=tag, timeout=timeout)


def read_via_engines(ckpt_dir: str | Path, recipe, tag: str | None = None, with_moments: bool = False,
                     timeout: int = 1800) -> FullState:
    """read_full_weights, and with_moments also Adam's exp_avg / exp_avg_sq and the optimizer's step count and lrs
    (what `recipes reshape` carries: recipes.checkpoint.format.read.read_full_state's meta)."""
    tag_dir = resolve_tag(ckpt_dir, tag)
    lay = detect_layout(tag_dir)
    if with_moments and lay.zero_stage not in (1, 2):
        raise CheckpointError(f"{tag_dir}: a ZeRO-{lay.zero_stage} checkpoint of a mixture-of-experts model; its Adam "
                              "moments are read from ZeRO-1/2 partitions (train with parallel.zero_stage=1)")
    at_layout = source_recipe(recipe, tag_dir, lay)
    with tempfile.TemporaryDirectory(prefix="state-reader-") as tmp:
        write_recipe(at_layout, Path(tmp))
        _run_ranks(lay.tp * lay.pp * lay.dp, ["--recipe", str(Path(tmp) / RECIPE_FILE), "--checkpoint",
                                                str(ckpt_dir), "--tag", tag_dir.name, "--out", tmp]
                   + (["--moments"] if with_moments else []), timeout)
        parts = {kind: _join_parts(Path(tmp), lay.pp, kind) for kind in (KINDS if with_moments else KINDS[:1])}
    meta = checkpoint_meta(tag_dir, lay, optimizer=with_moments)
    meta["source_layout"] = {**lay.__dict__, "ep": at_layout.parallel.ep}
    return FullState(weights=parts["weights"], exp_avg=parts.get("exp_avg", OrderedDict()),
                     exp_avg_sq=parts.get("exp_avg_sq", OrderedDict()), meta=meta)


def source_recipe(recipe, tag_dir: Path, lay):
    """The recipe at the layout `tag_dir` was saved at: TP, PP, the data axis DP x CP (as cp = 1), the ZeRO stage
    from its files, EP from its record (else the recipe's: a tag from before the record)."""
    saved = saved_layout(tag_dir)
    at_layout = recipe.model_copy(deep=True)
    ep = saved.ep if saved.recorded else recipe.parallel.ep
    for key, value in (("tp", lay.tp), ("pp", lay.pp), ("dp", lay.dp), ("cp", 1), ("ep", ep),
                       ("zero_stage", lay.zero_stage)):
        setattr(at_layout.parallel, key, value)
    return at_layout


def _run_ranks(world: int, args: list[str], timeout: int) -> None:
    from recipes.train.local_workers import run_ranks

    run_ranks(world, "recipes.train.state_reader", main, args, timeout)


def _join_parts(parts_dir: Path, stages: int, kind: str) -> OrderedDict:
    from safetensors.torch import load_file

    joined: dict = {}
    for stage in range(stages):
        for name, t in load_file(str(parts_dir / _part_name(stage, kind))).items():
            joined.setdefault(name, t)  # a tied embedding's copy on the last stage: the first stage's is in use
    names = sorted(joined, key=lambda n: (int(n.split(".", 1)[0]), n))
    return OrderedDict((n, joined[n]) for n in names)


def _part_name(stage: int, kind: str) -> str:
    return f"part-{stage}-{kind}.safetensors"


# ------------------------------------------------------------------------------------------------- in each rank
def _rank_main(recipe_path: Path, ckpt_dir: str, tag: str, out_dir: Path, moments: bool = False) -> int:
    from megatron.core import parallel_state as ps
    from safetensors.torch import save_file

    from recipes.checkpoint.format.engine_state import gather_full_state, link_loaded_moments
    from recipes.config.loading import load_recipe
    from recipes.config.logs import setup_logging
    from recipes.parallel.layout import Layout
    from recipes.train import groups
    from recipes.train.engine import init_distributed, initialize

    setup_logging(quiet=True)
    recipe = load_recipe(str(recipe_path), ["cluster.device=cpu", "cluster.backend=gloo"])
    device = init_distributed(recipe)
    layout = Layout.from_recipe(recipe, torch.distributed.get_world_size())
    groups.build(layout)
    eng = initialize(recipe, layout, device, recipe.training.steps(recipe.model.seq_length))
    eng.engine.load_checkpoint(ckpt_dir, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=False)
    if moments:
        link_loaded_moments(eng)
    state = gather_full_state(eng, recipe, KINDS if moments else KINDS[:1])
    if ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
        stage = ps.get_pipeline_model_parallel_rank()
        for kind, tensors in state.items():
            save_file(dict(tensors), str(out_dir / _part_name(stage, kind)))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipes.train.state_reader", description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", required=True, type=Path)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--moments", action="store_true", help="Adam's moments too (part-STAGE-exp_avg*.safetensors)")
    ns = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    return _rank_main(ns.recipe, ns.checkpoint, ns.tag, ns.out, ns.moments)


if __name__ == "__main__":
    sys.exit(main())

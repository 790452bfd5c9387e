"""Write a training checkpoint at any layout from a full state directory (recipes.checkpoint.format.full_state): the
engine is built at the target layout (one process per rank on this machine, CPU/gloo: recipes.train.local_workers), every rank puts
its shards of the full state into it (recipes.checkpoint.format.engine_state), and `recipes.checkpoint.store.save`
writes the DeepSpeed files + complete.json. `python -m recipes train` at that layout then resumes from it as from
its own. Here, not in recipes.checkpoint, because it builds the training engine."""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from recipes.checkpoint.format.full_state import save_full_state
from recipes.checkpoint.recipe_file import RECIPE_FILE
from recipes.config import file_mode

log = logging.getLogger(__name__)


def write_checkpoint(state_dir: Path, out_dir: Path, world_size: int, quiet: bool = False, timeout: int = 1800) -> None:
    """Run the writer on `world_size` local processes (recipes.train.local_workers); raises with the ranks' output on
    failure."""
    from recipes.train.local_workers import run_ranks

    stderr = run_ranks(world_size, "recipes.train.state_writer", main, ["--state", str(state_dir), "--out",
                                                                         str(out_dir)], timeout)
    if not quiet:  # the ranks' own log lines about the save, once (rank 0 logs them)
        for line in stderr.splitlines():
            if line.startswith("checkpoint:"):
                log.info(line)


def publish_checkpoint(out: Path, world_size: int, weights: dict, meta: dict, recipe, exp_avg: dict | None = None,
                       exp_avg_sq: dict | None = None, quiet: bool = False) -> Path:
    """Full state -> a training checkpoint at `recipe`'s layout, built in a hidden sibling directory and renamed to
    `out` only when complete, so an interrupted import/reshape never leaves anything that looks like a checkpoint."""
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        save_full_state(work / "full_state", weights, meta, recipe, exp_avg, exp_avg_sq)
        write_checkpoint(work / "full_state", work / "checkpoint", world_size, quiet=quiet)
        if out.exists():
            out.rmdir()  # callers refuse a non-empty out; an empty one is replaced
        os.replace(work / "checkpoint", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    file_mode.fix_tree(out, file_mode.recipe_mode(recipe))  # checkpoint.file_mode (import-hf, the engine reshape)
    return out


def _rank_main(state_dir: Path, out_dir: Path) -> int:
    from megatron.core import parallel_state

    from recipes.checkpoint import store
    from recipes.checkpoint.format import layout_record
    from recipes.checkpoint.format.engine_state import install_full_state
    from recipes.checkpoint.format.full_state import open_full_state
    from recipes.config.loading import load_recipe
    from recipes.config.logs import setup_logging
    from recipes.parallel.layout import Layout
    from recipes.train import groups
    from recipes.train.engine import init_distributed, initialize

    setup_logging()
    recipe = load_recipe(str(state_dir / RECIPE_FILE), ["cluster.device=cpu", "cluster.backend=gloo"])
    state = open_full_state(state_dir)
    device = init_distributed(recipe)
    layout = Layout.from_recipe(recipe, torch.distributed.get_world_size())
    groups.build(layout)
    eng = initialize(recipe, layout, device, recipe.training.steps(recipe.model.seq_length))
    install_full_state(eng, recipe, state, parallel_state.get_tensor_model_parallel_rank(),
                       parallel_state.get_expert_model_parallel_rank())
    cs = state.meta["client_state"]
    store.save(eng.engine, str(out_dir), int(cs.get("step", 0)), cs, keep_last=recipe.checkpoint.keep_last,
               record=layout_record.record(recipe, layout))
    if torch.distributed.get_rank() == 0:
        (Path(out_dir) / RECIPE_FILE).write_text((state_dir / RECIPE_FILE).read_text())
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipes.train.state_writer", description=__doc__.split("\n")[0])
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ns = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    return _rank_main(ns.state, ns.out)


if __name__ == "__main__":
    sys.exit(main())

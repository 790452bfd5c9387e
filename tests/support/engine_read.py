"""A checkpoint's full state with Adam's moments, read by engines at its own layout
(recipes.train.state_reader.read_via_engines), for tests: `read_by_engines` runs this module forked from the tests'
pre-imported template (tests.support.forkserver), whose engine ranks are then forked too (recipes.train.local_workers)
instead of a torchrun of fresh interpreters from the pytest process.

    python -m tests.support.engine_read CHECKPOINT_DIR TAG OUT_DIR    (OUT_DIR: a full state directory)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support import forkserver
from tests.support.runs import REPO, worker_env


def read_by_engines(ckpt_dir: Path, tag: str, out_dir: Path) -> dict:
    """{"weights" | "exp_avg" | "exp_avg_sq": {name: tensor}, "meta": dict} of `ckpt_dir`/`tag`."""
    from safetensors.torch import load_file

    from recipes.checkpoint.format.full_state import EXP_AVG, EXP_AVG_SQ, META, WEIGHTS

    proc = forkserver.run([str(ckpt_dir), tag, str(out_dir)], worker_env(), REPO, 400, module="tests.support.engine_read")
    assert proc.returncode == 0, proc.stderr[-4000:]
    state = {kind: load_file(str(out_dir / name)) for kind, name in
             (("weights", WEIGHTS), ("exp_avg", EXP_AVG), ("exp_avg_sq", EXP_AVG_SQ))}
    return {**state, "meta": json.loads((out_dir / META).read_text())}


def main(argv: list[str]) -> int:
    from recipes.checkpoint.format.full_state import save_full_state
    from recipes.checkpoint.recipe_file import load_checkpoint_recipe
    from recipes.train.state_reader import read_via_engines

    ckpt, tag, out = argv
    recipe = load_checkpoint_recipe(ckpt, None, [])
    state = read_via_engines(ckpt, recipe, tag=tag, with_moments=True)
    save_full_state(Path(out), state.weights, state.meta, recipe, state.exp_avg, state.exp_avg_sq)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

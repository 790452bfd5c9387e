"""Peak memory and time of the streaming reshape, side by side for several checkpoints: does peak RSS follow the
largest tensor or the model?

    python -m recipes bench-reshape --to tp=2,pp=2,dp=4 CKPT_A CKPT_B ...

Each checkpoint is re-laid by a fresh `python -m recipes reshape --writer stream` child (its recipe.yaml gives the
model); its peak RSS comes from the kernel (wait4's ru_maxrss), next to the RSS of a child that only imports what the
writer imports (the fixed cost of torch + DeepSpeed), the model's parameter count, its largest tensor and the
optimizer-state bytes. Output goes to a temporary directory, removed afterwards.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _child(cmd: list[str]) -> tuple[float, int]:
    """(seconds, peak RSS bytes) of one child process (ru_maxrss is KiB on Linux)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr.read().decode()[-3000:]}")
    return time.time() - t0, usage.ru_maxrss * 1024


def _sizes(ckpt: str) -> dict:
    from recipes.checkpoint.read import resolve_tag
    from recipes.checkpoint.recipe_file import load_checkpoint_recipe
    from recipes.checkpoint.relayout import Source

    recipe = load_checkpoint_recipe(ckpt, None, [])
    src = Source(resolve_tag(ckpt), recipe.model)
    numels = [math.prod(src.full_shape(n)) for n in src.order]
    return {"params": sum(numels), "largest": max(numels), "layers": recipe.model.num_layers,
            "hidden": recipe.model.hidden_size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipes bench-reshape", description=__doc__.split("\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--to", required=True, help="target layout, e.g. tp=2,pp=2,dp=4")
    ns = ap.parse_args(argv)
    _, base_rss = _child([sys.executable, "-c", "import recipes.checkpoint.relayout, deepspeed.utils.tensor_fragment"])
    print(f"import-only child: peak RSS {base_rss / 2**20:.0f} MiB (torch + DeepSpeed)")
    print(f"{'checkpoint':<28} {'layers':>6} {'hidden':>6} {'params':>12} {'largest':>11} {'optim GiB':>9} "
          f"{'written GiB':>11} {'time s':>7} {'peak MiB':>9} {'-imports':>9} {'/largest x12B':>13}")
    for ckpt in ns.checkpoints:
        s = _sizes(ckpt)
        out = Path(tempfile.mkdtemp(prefix="bench-reshape-"))
        try:
            secs, rss = _child([sys.executable, "-m", "recipes", "reshape", "--checkpoint", ckpt, "--out",
                                str(out / "ckpt"), "--to", ns.to, "--writer", "stream", "--quiet"])
            written = sum(p.stat().st_size for p in (out / "ckpt").rglob("*") if p.is_file())
        finally:
            shutil.rmtree(out, ignore_errors=True)
        net = rss - base_rss
        print(f"{Path(ckpt).name[:28]:<28} {s['layers']:>6} {s['hidden']:>6} {s['params']:>12,} {s['largest']:>11,} "
              f"{s['params'] * 12 / 2**30:>9.2f} {written / 2**30:>11.2f} {secs:>7.1f} {rss / 2**20:>9.0f} "
              f"{net / 2**20:>9.0f} {net / (s['largest'] * 12):>13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

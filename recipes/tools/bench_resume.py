"""The time to resume a checkpoint at another layout (resharded on load) vs at its own (DeepSpeed's load), side by side
for the same checkpoint in one run.

    python -m recipes bench-resume --data MANIFEST [--config RECIPE] --ranks N --saved k=v,... --to k=v,... \
        [--repeat 3] [overrides ...]

A run of the recipe at `--saved` trains `--steps` steps and saves; then, alternating, copies of its checkpoint are
resumed at `--saved` (loaded as saved) and at `--to` (resharded on load), each for one more step, `--repeat` times.
The time is what `recipes train` logs for the load itself ("loaded as saved / resharded in N s": every rank's load,
up to the barrier after it), not the start-up around it. Output goes to a temporary directory, removed afterwards.
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from recipes.config.cli_help import command_parser

REPO = Path(__file__).resolve().parents[2]
_LOADED = re.compile(r"loaded (as saved|resharded) in ([0-9.]+) s")


def _train(ranks: int, config: str, overrides: list[str]) -> str:
    cmd = [sys.executable, "-m", "recipes", "train", "--config", config, "--local", str(ranks), "--quiet", *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def _pairs(spec: str) -> list[str]:
    return [f"parallel.{kv.strip()}" for kv in spec.split(",") if kv.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m recipes bench-resume", __doc__)
    ap.add_argument("--data", required=True, help="a data_prep manifest.json (python -m data_prep demo DIR makes one)")
    ap.add_argument("--config", default=str(REPO / "configs" / "runs" / "tiny-cpu.yaml"))
    ap.add_argument("--ranks", type=int, default=4, help="CPU ranks of both runs (--local N)")
    ap.add_argument("--saved", default="tp=2,pp=2", help="the layout the checkpoint is saved at, e.g. tp=2,pp=2")
    ap.add_argument("--to", default="tp=1,pp=2", help="the other layout it is resumed at")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("overrides", nargs="*", help="recipe overrides for every run (e.g. a bigger model)")
    ns = ap.parse_args(argv)
    base = [f"data.manifests=[{ns.data}]", "checkpoint.async_save=false", "training.eval_interval=1000000",
            "logging.tensorboard=false", *ns.overrides]
    root = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    try:
        source = root / "source"
        _train(ns.ranks, ns.config, [*base, *_pairs(ns.saved), f"checkpoint.dir={source}",
                                     f"training.train_steps={ns.steps}", f"checkpoint.save_interval={ns.steps}"])
        size = sum(p.stat().st_size for p in source.rglob("global_step*/*") if p.is_file())
        seconds: dict[str, list[float]] = {"as saved": [], "resharded": []}
        for i in range(ns.repeat):
            for name, layout in (("saved", ns.saved), ("to", ns.to)):
                run = root / f"{name}{i}"
                shutil.copytree(source, run)
                out = _train(ns.ranks, ns.config, [*base, *_pairs(layout), f"checkpoint.dir={run}",
                                                   f"training.train_steps={ns.steps + 1}",
                                                   "checkpoint.save_interval=1000000"])
                how, secs = _LOADED.search(out).groups()
                seconds[how].append(float(secs))
                shutil.rmtree(run)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    same, other = statistics.median(seconds["as saved"]), statistics.median(seconds["resharded"])
    print(f"checkpoint: {size / 2**20:.1f} MiB saved at {ns.saved} on {ns.ranks} ranks; load {os.getloadavg()[0]:.1f}")
    print(f"resume at the saved layout ({ns.saved}): median {same:.2f} s  {seconds['as saved']}")
    print(f"resume at {ns.to} (resharded on load): median {other:.2f} s  {seconds['resharded']}")
    print(f"resharding on load / loading as saved: {other / same:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

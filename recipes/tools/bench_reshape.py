"""Peak memory and time of the streaming reshape, side by side for several checkpoints and worker counts: does peak RSS
follow the largest tensor or the model, and what do N workers buy?

    python -m recipes bench reshape --to tp=2,pp=2,dp=4 [--workers 1,2] CKPT_A CKPT_B ...

Each checkpoint is re-laid by a fresh `python -m recipes reshape --writer stream --workers N` child per worker count
(its recipe.yaml gives the model). Memory: the child's own peak RSS from the kernel (wait4's ru_maxrss; with workers it
is the largest of the tree, i.e. one worker), next to the RSS of a child that only imports what the writer imports (the
fixed cost of torch + DeepSpeed); with workers also each worker's peak (VmHWM) and the peak of the whole tree's
proportional set size (PSS: pages shared between the forked workers counted once), sampled every 50 ms from /proc.
Also the model's parameter count, its largest tensor and the optimizer-state bytes. Output goes to a temporary
directory, removed afterwards.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recipes.config.cli_help import command_parser


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for task in os.listdir(f"/proc/{pid}/task")
                for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except OSError:
        return []


def _kib(path: str, field: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _child(cmd: list[str]) -> dict:
    """Seconds and memory (bytes) of one child process tree: peak RSS (kernel), per-worker VmHWM, peak total PSS."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    hwm: dict[int, int] = {}
    total_pss = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # ru_maxrss: the largest of the child and its workers
        if pid:
            break
        workers = _children(proc.pid)
        for w in workers:
            hwm[w] = max(hwm.get(w, 0), _kib(f"/proc/{w}/status", "VmHWM:"))
        total_pss = max(total_pss, sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in [proc.pid, *workers]))
        time.sleep(0.05)
    secs = time.time() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr.read().decode()[-3000:]}")
    return {"seconds": secs, "peak": usage.ru_maxrss * 1024, "worker_peak": max(hwm.values(), default=0) * 1024,
            "total_pss": total_pss * 1024}


def _sizes(ckpt: str) -> dict:
    from recipes.checkpoint.format.tags import resolve_tag
    from recipes.checkpoint.recipe_file import load_checkpoint_recipe
    from recipes.checkpoint.format.relayout import Source

    recipe = load_checkpoint_recipe(ckpt, None, [])
    src = Source(resolve_tag(ckpt), recipe.model)
    numels = [math.prod(src.full_shape(n)) for n in src.order]
    return {"params": sum(numels), "largest": max(numels), "layers": recipe.model.num_layers,
            "hidden": recipe.model.hidden_size}


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m recipes bench reshape", __doc__)
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--to", required=True, help="target layout, e.g. tp=2,pp=2,dp=4")
    ap.add_argument("--workers", default="1", help="comma-separated worker counts to compare, e.g. 1,2 (default 1)")
    ns = ap.parse_args(argv)
    counts = [int(w) for w in ns.workers.split(",")]
    base = _child([sys.executable, "-c", "import recipes.checkpoint.format.relayout, deepspeed.utils.tensor_fragment"])
    base_rss = base["peak"]
    print(f"import-only child: peak RSS {base_rss / 2**20:.0f} MiB (torch + DeepSpeed); load {os.getloadavg()[0]:.1f}")
    print(f"{'checkpoint':<20} {'layers':>6} {'hidden':>6} {'params':>12} {'largest':>11} {'optim GiB':>9} "
          f"{'written GiB':>11} {'workers':>7} {'time s':>7} {'speedup':>7} {'peak MiB':>9} {'-imports':>9} "
          f"{'/largest x12B':>13} {'worker MiB':>10} {'tree PSS MiB':>12}")
    for ckpt in ns.checkpoints:
        s = _sizes(ckpt)
        first = None
        for n in counts:
            out = Path(tempfile.mkdtemp(prefix="bench reshape-"))
            try:
                m = _child([sys.executable, "-m", "recipes", "reshape", "--checkpoint", ckpt, "--out",
                            str(out / "ckpt"), "--to", ns.to, "--writer", "stream", "--workers", str(n), "--quiet"])
                written = sum(p.stat().st_size for p in (out / "ckpt").rglob("*") if p.is_file())
            finally:
                shutil.rmtree(out, ignore_errors=True)
            first = first or m["seconds"]
            net = m["peak"] - base_rss
            worker = f"{m['worker_peak'] / 2**20:>10.0f}" if m["worker_peak"] else f"{'-':>10}"
            print(f"{Path(ckpt).name[:20]:<20} {s['layers']:>6} {s['hidden']:>6} {s['params']:>12,} "
                  f"{s['largest']:>11,} {s['params'] * 12 / 2**30:>9.2f} {written / 2**30:>11.2f} {n:>7} "
                  f"{m['seconds']:>7.1f} {first / m['seconds']:>7.2f} {m['peak'] / 2**20:>9.0f} {net / 2**20:>9.0f} "
                  f"{net / (s['largest'] * 12):>13.1f} {worker} {m['total_pss'] / 2**20:>12.0f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m recipes bench save-stall`: how long a checkpoint save stalls training, sync vs async, side by side.

Each rank (local processes over gloo, CPU) builds the recipe's engine through `recipes.train.engine.initialize` (the
training path), trains on random tokens and saves through `recipes.checkpoint.store.Checkpointer`, sync and async
saves taking turns in the same processes on the same model (so machine noise hits both alike). Per save:

  sync stall  = time the training thread is blocked in save() (write + fsync of every file + complete.json)
  async stall = time blocked in save() (the host copy) + the extra time of the steps that ran while the background
                write was in flight (the writer shares the CPU) + any wait for the write at the end of the window

Both are measured the same way: the wall time of [save + the next `gap` steps + waiting for the save to complete]
minus `gap` median normal steps. `--gap` (default 8) should leave the write room to finish, as the steps between two
real saves do: a wait at the end of the window is counted, but real training would not wait there.

Placement (`--placement`, default both, one after the other): the training process always computes on one thread
(torch.set_num_threads(1), sync and async alike).
  pinned    each rank's training on a core of its own and its checkpoint writer process on another (sched_setaffinity):
            a GPU node, where the training's compute runs on the GPU, not on the host cores the writer uses
            (needs 2 cores per rank)
  unpinned  training and writer share every core (the writer at nice 19): a host without a spare core

Default model: about 110M parameters (hidden 1536, 3 layers, vocab 8192, seq 64), fp32 Adam: ~1.3 GB per save.

    python -m recipes bench save-stall                     # 1 rank, 3 saves of each kind, checkpoints in a temp dir
    python -m recipes bench save-stall --ranks 2 --placement unpinned --dir /shared/scratch model.num_layers=6
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from recipes.train import local_workers
from recipes.config.cli_help import command_parser

warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/runs/tiny-cpu.yaml")
MODEL_110M = ["model.hidden_size=1536", "model.ffn_hidden_size=4096", "model.num_layers=3",
              "model.num_attention_heads=12", "model.num_query_groups=4", "model.vocab_size=8192",
              "model.seq_length=64"]


def _save_window(saver, step: int, gap: int, timed_step) -> dict:
    """The window: the save, then `gap` steps (polling, as the loop does), then waiting for the save if it is still in
    flight. Its excess over `gap` normal steps is the stall, whatever caused it (blocking, or steps slowed by the
    writer); noise in the steps cancels instead of adding up."""
    t0 = time.perf_counter()
    saver.save(step, {"step": step, "consumed_samples": step})
    blocked = time.perf_counter() - t0
    during = []
    for _ in range(gap):
        in_flight = saver.inflight is not None
        t = timed_step()
        saver.poll()
        if in_flight:
            during.append(t)
    t1 = time.perf_counter()
    saver.finish()
    end = time.perf_counter()
    return {"blocked_s": blocked, "window_s": end - t0, "steps_s": end - t0 - blocked - (end - t1),
            "during_steps_s": during, "finish_wait_s": end - t1, "gap": gap}


def _worker(recipe_path: str, overrides: list[str], ranks: int, saves: int, out: Path, placement: str,
            gap: int) -> dict:
    import torch

    torch.set_num_threads(1)  # both modes, both placements: the training computes on one core
    writer_cpus = None
    if placement == "pinned":
        train_core, writer_core = _cores_of(int(os.environ["RANK"]), ranks)
        os.sched_setaffinity(0, {train_core})
        writer_cpus = {writer_core}

    from recipes.checkpoint.store import Checkpointer
    from recipes.config.loading import load_recipe
    from recipes.model.shape import count_parameters
    from recipes.parallel.layout import Layout
    from recipes.tools.bench_train import synthetic_steps
    from recipes.train import groups
    from recipes.train.engine import init_distributed, initialize
    from recipes.train.step import train_step

    recipe = load_recipe(recipe_path, overrides + ["parallel.tp=1", "parallel.pp=1", f"parallel.dp={ranks}",
                                                   "parallel.micro_batch=1", f"training.global_batch={ranks}"])
    device = init_distributed(recipe)
    layout = Layout.from_recipe(recipe, ranks)
    groups.build(layout)
    total = 3 + (2 * saves) * (gap + 1) + 8
    eng = initialize(recipe, layout, device, total_steps=total)
    mbs = synthetic_steps(recipe, layout, device, 1)[0]
    savers = {mode: Checkpointer(eng.engine, str(out / mode), keep_last=1, background=mode == "async",
                                 device=device, writer_cpus=writer_cpus) for mode in ("sync", "async")}
    step = 0

    def timed_step() -> float:
        nonlocal step
        t0 = time.perf_counter()
        train_step(eng, mbs)
        step += 1
        return time.perf_counter() - t0

    for _ in range(3):  # warm-up: Adam's moments exist from the first step on
        timed_step()
    normal = [timed_step() for _ in range(gap)]
    rows = {"sync": [], "async": []}
    for _ in range(saves):
        for mode, saver in savers.items():
            timed_step()
            rows[mode].append(_save_window(saver, step, gap, timed_step))
        normal += [timed_step() for _ in range(2)]
    for saver in savers.values():
        saver.close()
    files = [p for p in (out / "async").rglob("*.pt")]
    return {"rank": torch.distributed.get_rank(), "params": count_parameters(recipe.model),
            "normal_steps_s": normal, "saves": rows, "rank_bytes": sum(p.stat().st_size for p in files) // ranks}


def _cores_of(rank: int, ranks: int) -> tuple[int, int]:
    """(the training's core, the writer's core) of `rank` under --placement pinned."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 * ranks:
        raise SystemExit(f"bench save-stall: --placement pinned needs 2 cores per rank ({2 * ranks} for --ranks "
                         f"{ranks}), this process may use {len(cores)}: use --placement unpinned or fewer --ranks")
    return cores[2 * rank], cores[2 * rank + 1]


def _fs_of(path: Path) -> str:
    """'<fs type> on <device>' of the file system holding `path` (from /proc/mounts)."""
    best = ("", "?", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fs = line.split()[:3]
            if str(path.resolve()).startswith(mnt) and len(mnt) >= len(best[0]):
                best = (mnt, fs, dev)
    except OSError:
        pass
    return f"{best[1]} on {best[2]}"


def summarize(per_rank: list[dict]) -> dict:
    """Per-save stall of each mode (the slowest rank's, as the ranks wait for each other), medians over saves."""
    normal = statistics.median(t for r in per_rank for t in r["normal_steps_s"])
    out = {"params": per_rank[0]["params"], "ranks": len(per_rank), "normal_step_s": normal,
           "checkpoint_bytes_per_rank": max(r["rank_bytes"] for r in per_rank)}
    for mode in ("sync", "async"):
        stalls, blocked, slower, waited = [], [], [], []
        for i in range(len(per_rank[0]["saves"][mode])):
            saves = [r["saves"][mode][i] for r in per_rank]
            gap = saves[0]["gap"]
            b = max(s["blocked_s"] for s in saves)
            d = max(s["steps_s"] - gap * normal for s in saves)
            w = max(s["finish_wait_s"] for s in saves)
            blocked.append(b), slower.append(d), waited.append(w)
            stalls.append(max(s["window_s"] for s in saves) - gap * normal)
        out[mode] = {"stall_s": statistics.median(stalls), "blocked_in_save_s": statistics.median(blocked),
                     "slower_steps_s": statistics.median(slower), "finish_wait_s": statistics.median(waited),
                     "stalls_s": stalls}
    out["async_over_sync"] = out["async"]["stall_s"] / out["sync"]["stall_s"]
    out["async_over_sync_blocked"] = out["async"]["blocked_in_save_s"] / out["sync"]["blocked_in_save_s"]
    return out


def measure(recipe: str, overrides: list[str], ranks: int, saves: int, out: Path, placement: str, gap: int,
            timeout: int = 1800) -> list[dict]:
    """Each rank's figures: the ranks forked from this process where that is safe (the imports paid once, not ~8 s
    of CPU per rank and placement), else fresh interpreters."""
    argv = ["--config", recipe, *overrides, "--worker", "--ranks", str(ranks), "--saves", str(saves), "--dir", str(out),
            "--placement", placement, "--gap", str(gap)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONWARNINGS="ignore",
               CUDA_VISIBLE_DEVICES="")
    outputs = local_workers.forked_outputs(ranks, main, argv, env, timeout)
    if outputs is None:
        outputs = local_workers.fresh_outputs(ranks, [sys.executable, "-m", "recipes", "bench", "save-stall", *argv],
                                              env, timeout)
    return [local_workers.last_json(o) for o in outputs]


def main(argv=None) -> int:
    ap = command_parser("python -m recipes bench save-stall", __doc__)
    ap.add_argument("overrides", nargs="*", help="recipe overrides (after the default ~110M model's)")
    ap.add_argument("--config", default=RECIPE)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--saves", type=int, default=3, help="saves of each kind")
    ap.add_argument("--dir", help="where the checkpoints go (default: a temporary directory, removed after)")
    ap.add_argument("--placement", choices=("pinned", "unpinned", "both"), default="both",
                    help="pinned: training and writer on separate cores (a GPU node); unpinned: sharing all cores")
    ap.add_argument("--gap", type=int, default=8, help="steps after each save in its window: room for an async "
                    "write to finish, as between real saves (default 8)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_intermixed_args(argv)
    overrides = MODEL_110M + args.overrides
    if args.worker:
        print(json.dumps(_worker(args.config, overrides, args.ranks, args.saves, Path(args.dir), args.placement,
                                   args.gap)),
              flush=True)
        return 0
    if args.dir and not Path(args.dir).is_dir():
        ap.error(f"--dir {args.dir}: no such directory (give an existing directory on the file system to measure)")
    local_workers.cpu_only_workers()  # the ranks train on CPU: no GPU seen here either, so that they can be forked
    placements = ("pinned", "unpinned") if args.placement == "both" else (args.placement,)
    if "pinned" in placements:
        _cores_of(args.ranks - 1, args.ranks)  # enough cores? (before minutes of work)

    runs = {}
    started = time.perf_counter()
    for placement in placements:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="save-stall-") as tmp:
            print(f"measuring {args.saves} sync and {args.saves} async saves on {args.ranks} rank(s), {placement}, in "
                  f"{tmp} ({_fs_of(Path(tmp))}) ...", file=sys.stderr, flush=True)
            runs[placement] = summarize(measure(args.config, overrides, args.ranks, args.saves, Path(tmp), placement,
                                                       args.gap))
            disk = _fs_of(Path(tmp))
    first = runs[placements[0]]
    s = {k: first[k] for k in ("params", "ranks", "checkpoint_bytes_per_rank")}
    s.update(disk=disk, seconds=time.perf_counter() - started, placements=runs)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"model {s['params'] / 1e6:.1f}M parameters, {s['ranks']} rank(s), "
          f"{s['checkpoint_bytes_per_rank'] / 2**30:.2f} GiB of checkpoint files per rank per save, disk {s['disk']}; "
          "training on 1 thread in both modes")
    for placement, r in runs.items():
        where = ("training and writer pinned to separate cores (as on a GPU node)" if placement == "pinned" else
                 "training and writer sharing all cores (writer at nice 19)")
        print(f"[{placement}] {where}")
        print(f"  normal step            {r['normal_step_s']:.3f} s (median)")
        for mode in ("sync", "async"):
            m = r[mode]
            print(f"  {mode:5} save stall       {m['stall_s']:.3f} s per save (median of {len(m['stalls_s'])}: blocked "
                  f"in save {m['blocked_in_save_s']:.3f} s + slower steps {m['slower_steps_s']:+.3f} s + "
                  f"waiting for the write {m['finish_wait_s']:.3f} s)")
        print(f"  async / sync           total {r['async_over_sync']:.1%}, blocked {r['async_over_sync_blocked']:.1%} "
              "(goal < 25%)")
    print(f"host shared memory for the async copy: {s['checkpoint_bytes_per_rank'] / 2**30:.2f} GiB per rank, kept "
          "for the whole run (reused by every save)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Entry point: `python -m recipes.pretrain --config RECIPE [section.key=value ...]`.

Under torchrun or the deepspeed launcher every process runs this (env:// rendezvous). `--local N` starts N CPU
worker processes on this machine itself (gloo), for tests and the demo. The recipe is validated before any worker
starts (--local) or before torch.distributed is initialised (launcher), so a bad recipe costs no start-up.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import warnings

from recipes.loading import RecipeError, load_recipe


def validate_recipe(recipe, world_size: int) -> None:
    """The shared validator when it exists; a minimal local check otherwise."""
    try:
        from recipes.validation import validate
    except ImportError:
        validate = _minimal_validate
    validate(recipe, world_size)
    _check_runs_here(recipe)


def _check_runs_here(recipe) -> None:
    """Limits of this machine rather than of the recipe."""
    import torch

    on_cpu = recipe.cluster.device == "cpu" or not torch.cuda.is_available()
    if on_cpu and recipe.parallel.sequence_parallel and recipe.parallel.tp > 1:
        # megatron-core's sequence-parallel linears gather into a CUDA-only buffer (GlobalMemoryBuffer).
        raise RecipeError("parallel.sequence_parallel = true needs CUDA GPUs (megatron-core's sequence-parallel "
                          "linears use a CUDA buffer); set parallel.sequence_parallel=false for CPU runs")


def _minimal_validate(recipe, world_size: int) -> None:  # fallback until recipes.validation lands
    from recipes.layout import Layout

    m, p = recipe.model, recipe.parallel
    errs = []
    if world_size % (p.tp * p.pp):
        errs.append(f"world size {world_size} is not divisible by parallel.tp x parallel.pp = {p.tp} x {p.pp}")
    else:
        layout = Layout.from_recipe(recipe, world_size)
        if layout.world_size != world_size:
            errs.append(f"parallel.dp = {layout.dp} gives {layout.world_size} ranks, not {world_size}")
        if recipe.training.global_batch % (layout.micro_batch * layout.dp):
            errs.append(f"training.global_batch = {recipe.training.global_batch} must be a multiple of "
                        f"parallel.micro_batch x dp = {layout.micro_batch} x {layout.dp}")
    if m.num_attention_heads % p.tp or m.query_groups % p.tp:
        errs.append(f"model.num_attention_heads ({m.num_attention_heads}) and num_query_groups ({m.query_groups}) "
                    f"must be divisible by parallel.tp = {p.tp}")
    if p.pp > m.num_layers:
        errs.append(f"parallel.pp = {p.pp} exceeds model.num_layers = {m.num_layers}")
    if p.pp > 1 and p.zero_stage > 1:
        errs.append(f"parallel.zero_stage = {p.zero_stage} cannot run with pipeline parallelism (pp = {p.pp}); "
                    "use zero_stage 1 or pp 1")
    if errs:
        raise RecipeError("recipe refused:\n  - " + "\n  - ".join(errs))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(n: int, argv: list[str]) -> int:
    """Start n worker processes of this entry point (RANK/WORLD_SIZE env), stop them all if one fails."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(n),
               LOCAL_WORLD_SIZE=str(n), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.setdefault("CUDA_VISIBLE_DEVICES", "")  # --local is the CPU path
    procs = []
    for r in range(n):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(subprocess.Popen([sys.executable, "-m", "recipes.pretrain", *argv], env=e))

    def forward(signum, frame):  # pre-emption: pass the signal on; workers save and exit
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGUSR1, forward)
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            r, c = failed[0]
            print(f"pretrain --local: rank {r} exited with code {c}; stopping the other ranks", file=sys.stderr)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            return c if c > 0 else 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipes.pretrain", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="recipe file or preset name (configs/runs/...)")
    ap.add_argument("--local", type=int, metavar="N", help="start N CPU worker processes here (gloo)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar or per-step prints")
    ap.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. parallel.tp=2")
    ns = ap.parse_args(args)
    try:
        recipe = load_recipe(ns.config, ns.overrides)
        world = ns.local or int(os.environ.get("WORLD_SIZE", "1"))
        validate_recipe(recipe, world)
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if ns.local:
        argv = ["--config", ns.config, *(["--quiet"] if ns.quiet else []), *ns.overrides]
        return launch_local(ns.local, argv)

    # megatron-core announces its pure-torch fallbacks once per import in every rank; they are expected here.
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
    from recipes.train import run

    try:
        return run(recipe, quiet=ns.quiet)
    except Exception:
        import traceback

        rank = os.environ.get("RANK", "?")
        print(f"rank {rank}: training failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)  # skip atexit/destructors that could block on collectives; the launcher stops the job


if __name__ == "__main__":
    sys.exit(main())

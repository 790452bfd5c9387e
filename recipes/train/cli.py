"""Entry point: `python -m recipes train --config RECIPE [section.key=value ...]`.

Under torchrun or the deepspeed launcher every process runs this (env:// rendezvous). `--local N` starts N CPU
worker processes on this machine itself (gloo), for tests and the demo. The recipe is validated before any worker
starts (--local) or before torch.distributed is initialised (launcher), so a bad recipe costs no start-up.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import warnings

from recipes.config.file_mode import apply_recipe_mode
from recipes.config.loading import RecipeError, load_recipe
from recipes.config.logs import setup_logging
from recipes.parallel.rendezvous import local_world
from recipes.train import local_ranks, signals
from recipes.train.evaluation import check_include_path_origin
from recipes.config.cli_help import command_parser, count, refuse

log = logging.getLogger(__name__)


def validate_recipe(recipe, world_size: int, show_warnings: bool = True) -> None:
    """The shared cross-field rules (raise RecipeError listing every error), then the limits of this machine."""
    from recipes.planner.validation import validate

    for w in validate(recipe, world_size):
        if show_warnings:
            log.warning(str(w))
    _check_runs_here(recipe)


def _check_runs_here(recipe) -> None:
    """Limits of this machine rather than of the recipe."""
    import torch

    if recipe.evaluation.interval and not recipe.checkpoint.dir:
        raise RecipeError(f"evaluation.interval = {recipe.evaluation.interval} evaluates saved checkpoints but "
                          "checkpoint.dir is not set; set checkpoint.dir=DIR or remove evaluation.interval")

    on_cpu = recipe.cluster.device == "cpu" or not torch.cuda.is_available()
    if on_cpu and recipe.training.precision == "fp16":
        raise RecipeError("training.precision = fp16 is not supported by DeepSpeed on CPU; use training.precision=bf16 "
                          "or fp32 for CPU runs (fp16 with dynamic loss scaling runs on GPUs)")



def _warn_if_no_gpu(recipe) -> None:
    """A GPU recipe where torch sees no GPU trains on CPU (engine.pick_device); said once here, since DeepSpeed's own
    per-process "Setting accelerator to CPU" is dropped as noise (recipes.config.logs.LIBRARY_NOISE)."""
    import torch

    if recipe.cluster.device == "cuda" and not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        log.warning(f"cluster.device = cuda but torch sees no GPU here ({build}, CUDA_VISIBLE_DEVICES="
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!r}): this run trains on CPU with gloo; set "
                    "cluster.device=cpu if that is meant, else check the node's GPUs and the torch build")


def launch_local(n: int, argv: list[str]) -> int:
    """Start n worker processes of this entry point (RANK/WORLD_SIZE env), stop them all if one fails.

    Not torchrun (`torch.distributed.run --standalone`), measured here with torch 2.13: torchrun turns a SIGTERM
    pre-emption (workers save and exit 0) into exit 1 with a SignalException traceback, and a SIGUSR1 kills torchrun
    itself and leaves the workers running. This spawner forwards both and exits 0 after a clean save.
    The ranks are forked from this process once it has imported torch, DeepSpeed and megatron-core
    (recipes.train.local_ranks): each would otherwise pay those imports itself."""
    with local_world(n) as world:  # a private file store, gloo on loopback (recipes.parallel.rendezvous)
        env = dict(os.environ, **world, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env.setdefault("CUDA_VISIBLE_DEVICES", "")  # --local is the CPU path
        envs = [dict(env, RANK=str(r), LOCAL_RANK=str(r), RECIPES_LOCAL_WORKER="1") for r in range(n)]
        procs = local_ranks.start_ranks(envs, argv, main, _before_rank_imports)  # forked from a pre-imported template

        def forward(signum, frame):  # pre-emption: pass the signal on; workers save and exit
            for p in procs:
                p.send_signal(signum)  # a no-op for a rank already reaped

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGUSR1, forward)
        return local_ranks.wait_for_ranks(procs)


def _die_with_parent() -> None:
    """A `--local` worker gets SIGTERM when its launcher dies, even by SIGKILL (Linux PR_SET_PDEATHSIG): it saves and
    exits like on pre-emption instead of training on as an orphan."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux
    if os.getppid() == 1:  # the launcher died before the call above
        os.kill(os.getpid(), signal.SIGTERM)


EXAMPLES = (  # shown by --help
    "python -m data_prep demo out/demo   # shards + manifest.json to train on",
    "python -m recipes train --config configs/runs/tiny-cpu.yaml --local 8 "
    "data.manifests=[out/demo/shards/manifest.json] \\\n"
    "      model.vocab_size=3000 parallel.tp=2 parallel.pp=2 checkpoint.dir=runs/tiny   # 8 CPU ranks (gloo) here",
    "torchrun --nproc-per-node 8 -m recipes train --config RUN.yaml checkpoint.dir=/shared/ckpt/run1   # one GPU node",
    "launch/train.sh RUN.yaml --hostfile hosts -- checkpoint.dir=/shared/ckpt/run1   # many nodes (docs/cluster.md)",
    "(the same command again resumes from the newest complete checkpoint in checkpoint.dir)",
)
def _before_rank_imports() -> None:
    """A rank, before torch.distributed's users are imported."""
    # megatron-core announces its pure-torch fallbacks once per import in every rank; they are expected here.
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
    # Advice for CUDA streams and a torch rename inside DeepSpeed: nothing a user of this recipe can act on.
    warnings.filterwarnings("ignore", message=r".*CUDA_DEVICE_MAX_CONNECTIONS.*")
    warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.*is deprecated.*")
    from recipes.train.stragglers import COMM_CLOCK

    COMM_CLOCK.install()  # before DeepSpeed and megatron-core are imported: some of them bind torch.distributed's calls
    from data_prep.lazy_compile import import_with_compile_deferred

    import_with_compile_deferred()  # megatron-core and DeepSpeed without torch's compiler: ~2 s of CPU per rank


def _checked_recipe(ns):
    """The recipe, checked for this world before any worker or process group exists; RecipeError (or ValueError)
    naming every problem when it cannot start."""
    recipe = load_recipe(ns.config, ns.overrides)
    check_include_path_origin(ns.config, ns.overrides, recipe.evaluation.include_path)  # a task folder is code
    world = ns.local or int(os.environ.get("WORLD_SIZE", "1"))
    from recipes.planner.validation import launch_refusal, validate_for_launch

    problems = validate_for_launch(recipe, world)
    if problems:
        raise RecipeError(launch_refusal(recipe, problems))
    # Warnings once: from the --local launcher, or from rank 0 under a launcher.
    speaks = bool(ns.local) or os.environ.get("RANK", "0") == "0" and not os.environ.get("RECIPES_LOCAL_WORKER")
    validate_recipe(recipe, world, show_warnings=speaks)
    if speaks:
        _warn_if_no_gpu(recipe)
    return recipe


def _start_local(ns, recipe) -> int:
    """--local N: the lease checked, then N worker processes here."""
    from recipes.checkpoint import lease as run_lease

    os.environ.setdefault("RECIPES_RUN_ID", run_lease.run_id())  # the workers' run id (lease owner)
    problem = recipe.checkpoint.dir and run_lease.holder_problem(recipe.checkpoint.dir, os.environ["RECIPES_RUN_ID"])
    if problem:  # refused before any worker starts
        return refuse(problem)
    argv = ["--config", ns.config, *(["--quiet"] if ns.quiet else []), *ns.overrides]
    return launch_local(ns.local, argv)


def main(args: list[str] | None = None) -> int:
    ap = command_parser("python -m recipes train", __doc__, EXAMPLES)
    ap.add_argument("--config", required=True, help="recipe file or preset name (configs/runs/...)")
    ap.add_argument("--local", type=count(1), metavar="N", help="start N CPU worker processes here (gloo)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar or per-step prints")
    ap.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. parallel.tp=2")
    ns = ap.parse_args(args)
    if not ns.local:  # a rank: before the slow start-up, so a pre-emption during it still saves and exits cleanly
        signals.install()
        from recipes.train.heartbeat import install_stack_dump

        install_stack_dump()  # the launcher's hang watchdog sends SIGUSR2 for every rank's stack
    if ns.local:  # before anything imports torch: its thread pool and CUDA read these (the ranks are forked from here)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # --local is the CPU path
    setup_logging()  # events (resume, saves, skips) show even with --quiet, which hides per-step lines
    try:
        recipe = _checked_recipe(ns)
    except (RecipeError, ValueError) as e:
        return refuse(e)
    apply_recipe_mode(recipe)  # checkpoint.file_mode: before anything is written, here and in every child process
    if ns.local:
        return _start_local(ns, recipe)
    if os.environ.get("RECIPES_LOCAL_WORKER"):
        _die_with_parent()
    _before_rank_imports()
    from recipes.checkpoint.lease import LeaseError
    from recipes.train.trainer import run

    try:
        code = run(recipe, quiet=ns.quiet)
    except LeaseError as e:
        print(f"rank {os.environ.get('RANK', '?')}: error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    except Exception:
        import traceback

        rank = os.environ.get("RANK", "?")
        print(f"rank {rank}: training failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)  # skip atexit/destructors that could block on collectives; the launcher stops the job
    # Done (process groups already destroyed): leave without C++ static destructors, where gloo's threads can still
    # abort a finished rank under load ("terminate called without an active exception", seen in the launcher tests).
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

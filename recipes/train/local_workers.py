"""Local CPU ranks of a checkpoint worker (the engine reader and writer: recipes.train.state_reader,
recipes.train.state_writer) for reshape, import-hf and export-hf.

The ranks are forked from this process once it has imported torch, DeepSpeed and megatron-core (the --local
launcher's template, recipes.train.local_ranks: each fresh rank would pay ~8 s of CPU on imports first), each with
torch.distributed's environment (RANK, WORLD_SIZE, a private file store: recipes.parallel.rendezvous.local_world) and its output in a
file of its own. Where forking is unsafe (threads running here, GPUs visible, RECIPES_LOCAL_START=exec) they are
fresh interpreters under torchrun, as before. Either way a failure raises RuntimeError with the ranks' output, and
no rank outlives the call (killed on failure or timeout; a forked rank also dies with this process).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_ranks(world: int, module: str, worker_main, argv: list[str], timeout: float) -> str:
    """`python -m MODULE ARGV` on `world` local CPU ranks (`worker_main(argv)` is that module's main); returns the
    ranks' stderr."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), CUDA_VISIBLE_DEVICES="",
               PYTHONWARNINGS="ignore")
    outputs = forked_outputs(world, worker_main, argv, env, timeout)
    if outputs is not None:
        return "".join(outputs)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", "-m", module,
           *argv]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stderr


def forked_outputs(world: int, worker_main, argv: list[str], env: dict, timeout: float) -> list[str] | None:
    """`worker_main(argv)` on `world` ranks forked from this process (which imports torch, DeepSpeed and megatron-core
    first, once for all of them), with `env` and torch.distributed's variables; each rank's output (stdout and
    stderr). None where forking is unsafe here: the caller starts fresh interpreters instead."""
    from recipes.train import local_ranks

    if not (_can_fork() and local_ranks.prepare_template(_quiet_imports) is None):
        return None
    return _forked(world, worker_main, argv, env, timeout)


def fresh_outputs(world: int, cmd: list[str], env: dict, timeout: float) -> list[str]:
    """`cmd` as `world` fresh interpreters (RANK, WORLD_SIZE and the local world's store added to `env`);
    each one's stdout. RuntimeError with its stderr if one fails; none outlives the call."""
    from recipes.parallel.rendezvous import local_world

    with local_world(world) as meet:
        procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(env, **meet, RANK=str(r), LOCAL_RANK=str(r)))
                 for r in range(world)]
        try:
            outputs = []
            for p in procs:
                stdout, stderr = p.communicate(timeout=timeout)
                if p.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd[1:4])} worker failed ({p.returncode}):\n{stderr[-4000:]}")
                outputs.append(stdout)
            return outputs
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def last_json(output: str):
    """The last line of a worker's output that is a JSON object or array (what the measure tools' workers print last;
    a forked rank's output also holds its log lines)."""
    for line in reversed(output.splitlines()):
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except ValueError:  # a log line such as "[2026-12-03 ...] ..."
                continue
    raise RuntimeError(f"no JSON line in the worker's output:\n{output[-2000:]}")


def cpu_only_workers() -> None:
    """For the commands whose engine ranks always run on CPU (reshape, export-hf, import-hf): no GPU visible to this
    process unless the caller chose devices (CUDA_VISIBLE_DEVICES already set), so that the ranks can be forked."""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def _can_fork() -> bool:
    """No GPU visible (CUDA cannot be used after a fork) and no process group here (a rank would inherit it)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        return False
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    return not (dist is not None and dist.is_available() and dist.is_initialized())


def _quiet_imports() -> None:
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")


def _forked(world: int, worker_main, argv: list[str], env: dict, timeout: float) -> list[str]:
    from recipes.parallel.rendezvous import local_world
    from recipes.train import local_ranks

    with local_world(world) as meet, tempfile.TemporaryDirectory(prefix="ranks-") as logs:
        env = dict(env, **meet)
        outputs = [Path(logs) / f"rank{r}.log" for r in range(world)]
        procs = [local_ranks.fork_rank(dict(env, RANK=str(r), LOCAL_RANK=str(r)), argv,
                                       _logged(worker_main, outputs[r])) for r in range(world)]
        failed = _wait(procs, timeout)
        texts = [p.read_text(errors="replace") for p in outputs]
    if failed:
        raise RuntimeError(f"{failed}:\n{''.join(texts)[-6000:]}")
    return texts


def _logged(worker_main, path: Path):
    parent = os.getpid()  # taken before the fork: the rank checks it is still its parent's child

    def run(argv: list[str]) -> int:
        from recipes.checkpoint.writer import die_with_parent

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        die_with_parent(parent)  # SIGKILL when this process dies; never an orphan rank
        return worker_main(argv)
    return run


def _wait(procs: list, timeout: float) -> str | None:
    """None when every rank exited 0; else why not (the other ranks are then killed and reaped)."""
    deadline = time.monotonic() + timeout
    why = None
    while why is None:
        codes = [p.poll() for p in procs]
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            why = f"rank {bad[0][0]} exited with code {bad[0][1]}"
        elif all(c == 0 for c in codes):
            return None
        elif time.monotonic() > deadline:
            why = f"the ranks did not finish within {timeout:.0f} s"
        else:
            time.sleep(0.1)
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    return why

"""The worker processes of `recipes train --local N`, forked from a pre-imported template.

A fresh interpreter per rank pays ~8 s of CPU importing torch, DeepSpeed and megatron-core before it reads its
environment; with N ranks on a 2-core machine that is most of a short run. The launcher instead imports them once
(`prepare_template`) and forks the ranks, each then running exactly what an exec'd worker runs (`main` of
recipes.train.cli with RANK / WORLD_SIZE / RECIPES_LOCAL_WORKER in its environment): the same signal handling,
parent-death SIGTERM, exit codes and output streams.

Fork is safe only from a single-threaded process that has not initialised CUDA (a thread holding a lock at the fork
leaves it locked forever in the child; CUDA refuses to run in a forked child), so it is used only with no GPU visible
(CUDA_VISIBLE_DEVICES="", the --local default). Importing these libraries starts no
thread (checked by tests/training/test_local_fork.py); torch's intra-op pool and gloo start later, inside each rank.
If either condition fails anyway, or RECIPES_LOCAL_START=exec, the ranks are started as fresh interpreters as before.
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
import time
import traceback

log = logging.getLogger(__name__)

# What a rank imports before it trains, measured with `-X importtime` on the tiny recipe: megatron-core's
# parallel_state alone is ~5 s of CPU (it pulls in transformer_engine probes, apex probes, einops, ...).
TEMPLATE_MODULES = (
    "recipes.train.trainer",
    "megatron.core.parallel_state",
    "megatron.core.tensor_parallel",
    "megatron.core.datasets.blended_megatron_dataset_builder",
    "megatron.core.datasets.gpt_dataset",
    "megatron.core.datasets.blended_dataset",
    "deepspeed",
    "torch.distributed.pipelining",
    "recipes.model.layers",
    "recipes.parallel.cpu_buffers",
    "recipes.parallel.pipeline",
    "recipes.train.data",
    # torch's compiler, which a fresh rank imports only when it needs it (data_prep.lazy_compile): every rank's
    # optimizer imports torch._dynamo when it is built, a MoE router or a fused kernel compiles at its first call.
    # Imported once here, each forked rank shares them instead of importing them itself (~2-4 s of CPU per rank).
    "torch._dynamo",
    "torch._inductor.compile_fx",
)


FAILURE_GRACE_S = 5.0  # after one rank fails, how long the others may take to exit (and say why) on their own

_PRE_EMPTION = (signal.SIGTERM, signal.SIGUSR1)  # the signals the launcher forwards (recipes.train.signals)


def thread_count() -> int:
    """Threads of this process, native ones included (threading.enumerate sees only Python's)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: no /proc
        return -1


def fork_problem() -> str | None:
    """Why forking ranks from this process would be unsafe now, or None."""
    if os.environ.get("RECIPES_LOCAL_START", "fork") == "exec" or not hasattr(os, "fork"):
        return "RECIPES_LOCAL_START=exec" if hasattr(os, "fork") else "no os.fork on this platform"
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "":  # GPUs visible: torch.cuda.is_available() (the launcher's
        return "GPUs are visible (CUDA_VISIBLE_DEVICES)"  # checks) may have initialised the driver, unusable after fork
    threads = thread_count()
    if threads != 1:
        return f"the launcher has {threads} threads"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the launcher"
    return None


def stop_tqdm_monitor() -> None:
    """tqdm starts a monitor thread with its first progress bar and keeps it for the life of the process (import-hf
    shows transformers' loading bars before it starts its writer ranks): a second thread, so the ranks would be
    fresh interpreters (~8 s of CPU each on imports). It is stopped and joined here; a later bar starts another."""
    monitors = sys.modules.get("tqdm._monitor")
    if monitors is None:
        return
    import threading

    for monitor in [t for t in threading.enumerate() if isinstance(t, monitors.TMonitor)]:
        threads = thread_count()
        monitor.exit()  # wakes it and joins it
        monitor.tqdm_cls.monitor = None  # (the bar's class, a subclass of tqdm's own for transformers' bars)
        deadline = time.monotonic() + 2.0  # joined is not yet gone: the native thread ends a moment later
        while thread_count() >= threads and time.monotonic() < deadline:
            time.sleep(0.001)


def prepare_template(before_imports) -> str | None:
    """Import what every rank needs (after `before_imports`, the rank's own pre-import hook); None if the ranks can be
    forked from here now, else why not."""
    stop_tqdm_monitor()
    problem = fork_problem()
    if problem:
        return problem
    before_imports()
    for name in TEMPLATE_MODULES:
        importlib.import_module(name)
    return fork_problem()


class ForkedRank:
    """A forked rank with the part of subprocess.Popen's interface the launcher uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:  # not reaped: the pid is still this rank's (a zombie ignores the signal)
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_rank(env: dict, argv: list[str], worker_main) -> ForkedRank:
    """Fork one rank: its environment becomes `env`, it runs `worker_main(argv)` (what `python -m recipes train ARGV`
    runs) and leaves with its exit code, never returning into the launcher's code."""
    sys.stdout.flush()
    sys.stderr.flush()  # else buffered launcher output would be printed again by every child
    # Held back across the fork: one arriving before the child has dropped the launcher's handlers then meets the
    # default action, as it would in a fresh interpreter before the rank installs its own.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _PRE_EMPTION)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return ForkedRank(pid)
    code = 1
    try:
        for s in _PRE_EMPTION:  # a Python handler would not survive exec
            if callable(signal.getsignal(s)):
                signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.argv[0], "train", *argv]
        code = worker_main(argv)
    except SystemExit as e:  # argparse and friends
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        print(f"rank {env.get('RANK', '?')}: start failed:\n{traceback.format_exc()}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def start_ranks(envs: list[dict], argv: list[str], worker_main, before_imports) -> list:
    """One process per environment in `envs`: forked from a pre-imported template when that is safe, else fresh
    interpreters (`python -m recipes train ARGV`)."""
    problem = prepare_template(before_imports)
    if problem is None:
        return [fork_rank(env, argv, worker_main) for env in envs]
    log.debug(f"recipes train --local: starting the ranks as fresh interpreters ({problem})")
    return [subprocess.Popen([sys.executable, "-m", "recipes", "train", *argv], env=env) for env in envs]


def wait_for_ranks(procs: list, grace_s: float = FAILURE_GRACE_S) -> int:
    """Wait for the ranks (Popen or ForkedRank); 0 once all exit 0. When one fails, the others get `grace_s` to exit
    on their own, then are killed; returns the first failure's code. They usually fail too, at the same collective,
    each printing its own error, and the rank whose error is the cause (a full disk, a bad shard) is not always the
    first to exit: killed at once, it would never say why."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            r, c = failed[0]
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            print(f"recipes train --local: rank {r} exited with code {c}; stopping the other ranks", file=sys.stderr)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            return c if c > 0 else 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)

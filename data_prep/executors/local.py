"""The local executor: units in this process (one worker, or one unit), else a pool of forked worker processes.

A worker that dies (the OOM killer, a memory limit, a stray SIGKILL) breaks a ``ProcessPoolExecutor`` as a whole: every
unit still running or queued fails with ``BrokenProcessPool``, and nothing says which unit killed it. So the units the
break took down are run again one process each (up to ``workers`` at a time): a unit whose own process dies is handed
to ``on_result`` as ``WorkerDied`` (how it died), the others complete.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import traceback
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from data_prep import progress
from data_prep.executors.base import Executor, WorkerDied

log = logging.getLogger(__name__)


def _init_worker(progress_q) -> None:
    # One thread per worker: the processes are the parallelism.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _one_malloc_arena()
    progress.set_channel(progress_q)


def _one_malloc_arena() -> None:
    """glibc gives each new thread (the progress queue's feeder, an upload) its own arena, reserving 64 MiB of
    address space: under a ``ulimit -v`` that alone fails a bounded reader's 1 MiB buffer. A worker's threads are
    helpers, not parallelism, so one arena costs nothing. (The environment variable is too late after a fork.)"""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-8, 1)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc: nothing reserves per thread this way
        pass


def _death(exitcode) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = "; the OOM killer or a memory limit sends SIGKILL" if -exitcode == signal.SIGKILL else ""
        return (f"worker process killed by {name}{hint} (no record of the unit was written; lower -j or give the "
                f"job more memory, or look for an oversized record, then rerun)")
    return f"worker process died (exit code {exitcode}) before returning a result; rerun to retry"


def _run_one(task, unit, conn, progress_q) -> None:
    """The body of a one-unit process: the result (or the exception, with its traceback) goes back through ``conn``."""
    _init_worker(progress_q)
    if os.environ.get("DATA_PREP_TEST_KILL_UNIT") == getattr(unit, "name", None):
        os.kill(os.getpid(), signal.SIGKILL)  # tests: a worker dying mid-unit, as under the OOM killer
    try:
        res = ("ok", task(unit))
    except BaseException as e:  # noqa: BLE001  (re-raised in the driver)
        tb = traceback.format_exc()
        try:
            import pickle

            pickle.dumps(e)
            res = ("raise", (e, tb))
        except Exception:
            res = ("raise", (RuntimeError(f"{type(e).__name__}: {e}"), tb))
    conn.send(res)
    conn.close()


def _pool_task(task, unit):
    # Tests only: DATA_PREP_TEST_KILL_UNIT=<unit name> makes the worker that starts that unit SIGKILL itself, as the
    # OOM killer would; unset (always, outside tests) it does nothing.
    if os.environ.get("DATA_PREP_TEST_KILL_UNIT") == getattr(unit, "name", None):
        os.kill(os.getpid(), signal.SIGKILL)
    return task(unit)


class LocalExecutor(Executor):
    def __init__(self, workers: int):
        self.workers = workers

    def run(self, task, units, on_result, bar) -> None:
        if self.workers <= 1 or len(units) <= 1:
            q = queue_mod.SimpleQueue()
            _init_worker(q)
            try:
                for u in units:
                    res = task(u)
                    bar.drain(q)
                    on_result(u, res)
            finally:
                progress.set_channel(None)
            return
        broken = self._run_pool(task, units, on_result, bar)
        if broken:
            log.warning(f"data_prep: a worker process died; running the {len(broken)} unit(s) it took down one "
                        "process each, to find the one that kills its worker")
            self._run_isolated(task, broken, on_result, bar)

    def _run_pool(self, task, units, on_result, bar) -> list:
        """Run ``units`` on a pool of forked workers; returns the units lost to a broken pool (a worker died)."""
        # fork: workers start from the driver's loaded tokenizer and encoder instead of loading their own
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        broken = []
        with ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker, initargs=(q,)) as pool:
            futures = {pool.submit(_pool_task, task, u): u for u in units}
            pending = set(futures)
            try:
                while pending:
                    bar.drain(q, timeout=0.2)
                    finished = [f for f in pending if f.done()]
                    for f in sorted(finished, key=lambda f: futures[f].index):
                        pending.discard(f)
                        try:
                            res = f.result()
                        except BrokenProcessPool:
                            broken.append(futures[f])
                            continue
                        on_result(futures[f], res)
            except BaseException:
                # a bug, a fast-path mismatch, a full disk or Ctrl-C: stop now, do not start more units
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        bar.drain(q)  # after shutdown: the workers have exited, so their last messages are in the pipe
        return sorted(broken, key=lambda u: u.index)

    def _run_isolated(self, task, units, on_result, bar) -> None:
        """Each unit in its own forked process, ``workers`` at a time, so a death is that unit's alone."""
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        todo = list(units)
        running = {}  # process -> (unit, receiving end)
        try:
            while todo or running:
                while todo and len(running) < self.workers:
                    u = todo.pop(0)
                    recv, send = ctx.Pipe(duplex=False)
                    p = ctx.Process(target=_run_one, args=(task, u, send, q), daemon=True)
                    p.start()
                    send.close()
                    running[p] = (u, recv)
                bar.drain(q, timeout=0.2)
                for p, (u, recv) in list(running.items()):
                    res = None
                    if recv.poll():
                        try:
                            res = recv.recv()
                        except EOFError:  # the process died without sending anything
                            res = None
                    elif p.is_alive():
                        continue
                    p.join()
                    recv.close()
                    del running[p]
                    if res is None:
                        on_result(u, WorkerDied(_death(p.exitcode)))
                    elif res[0] == "raise":
                        exc, tb = res[1]
                        raise exc from RuntimeError(f"in the worker process of {getattr(u, 'name', u)}:\n{tb}")
                    else:
                        on_result(u, res[1])
        finally:
            for p in running:
                p.kill()
                p.join()
        bar.drain(q)

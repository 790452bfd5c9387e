"""The local executor: units in this process (one worker, or one unit), else a pool of forked worker processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
from concurrent.futures import ProcessPoolExecutor

from data_prep import progress
from data_prep.executors.base import Executor


def _init_worker(progress_q) -> None:
    # One thread per worker: the processes are the parallelism.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    progress.set_channel(progress_q)


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
        # fork: workers start from the driver's loaded tokenizer and encoder instead of loading their own
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        with ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker, initargs=(q,)) as pool:
            futures = {pool.submit(task, u): u for u in units}
            pending = set(futures)
            try:
                while pending:
                    bar.drain(q, timeout=0.2)
                    finished = [f for f in pending if f.done()]
                    for f in finished:
                        pending.discard(f)
                        on_result(futures[f], f.result())
            except BaseException:
                # a bug, a fast-path mismatch, a full disk or Ctrl-C: stop now, do not start more units
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        bar.drain(q)  # after shutdown: the workers have exited, so their last messages are in the pipe

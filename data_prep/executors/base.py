"""The executor interface: run a task on every work unit, hand each result back as it arrives.

``Executor.run(task, units, on_result, bar)`` calls ``task(unit)`` for every unit (in this process, in a pool of forked
workers, as Ray tasks) and ``on_result(unit, result)`` in the driver as each one finishes; tasks report progress with
``data_prep.progress.report``, which the executor connects to ``bar``. An executor knows nothing of what the task does.

Clusters run slices: slice I of N is the units whose index % N == I (``select_slice``); each slice runs this same
interface on its node. Slurm job arrays (executors/slurm.py: one array task per slice) and hostfile nodes over ssh
(launch/prep.sh: one node per slice) start the slices; the last slice to finish, or ``tokenize --merge-only``, writes
the manifest.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

U = TypeVar("U")  # a work unit: anything with an ``index`` (read.units.Unit)
KINDS = ("local", "ray")


class WorkerDied:
    """The result ``on_result`` gets for a unit whose worker process died under it (the OOM killer, a signal, a
    memory limit): the unit failed, the other units carry on. ``why`` says how it died, for the failure record."""

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:
        return f"WorkerDied({self.why!r})"


class Executor(ABC):
    @abstractmethod
    def run(self, task: Callable[[U], Any], units: Sequence[U], on_result: Callable[[U, Any], None], bar) -> None:
        """Run ``task`` on every unit; call ``on_result(unit, result)`` here as each finishes, with a ``WorkerDied``
        as the result when the unit's worker process died. A task that raises stops the run (units not started are
        not started) and the error propagates."""

    def close(self) -> None:
        """Release what the executor kept between runs (``session``); nothing by default."""


def select_slice(units: Sequence[U], index: int, count: int) -> List[U]:
    """The units of slice ``index`` of ``count``: a deterministic share that needs no coordination between nodes."""
    return [u for u in units if u.index % count == index]


_SHARED: Optional[Dict[Tuple[str, int, Optional[str]], Executor]] = None


@contextlib.contextmanager
def session() -> Iterator[None]:
    """Within it, ``make_executor`` gives one executor per (kind, workers, address), kept between runs and closed at
    the end: a command of several passes (curate: hash, buckets, filter) starts one private Ray instance, not one
    per pass (~5 s of start and stop each)."""
    global _SHARED
    if _SHARED is not None:  # nested: the outer session owns them
        yield
        return
    _SHARED = {}
    try:
        yield
    finally:
        shared, _SHARED = _SHARED, None
        for executor in shared.values():
            executor.close()


def make_executor(kind: str, workers: int, ray_address: Optional[str] = None) -> Executor:
    key = (kind, workers, ray_address)
    if _SHARED is not None and key in _SHARED:
        return _SHARED[key]
    if kind == "local":
        from data_prep.executors.local import LocalExecutor

        executor: Executor = LocalExecutor(workers)
    elif kind == "ray":
        from data_prep.executors.ray import RayExecutor

        executor = RayExecutor(workers, ray_address, keep=_SHARED is not None)
    else:
        raise ValueError(f"unknown executor {kind!r}: choose one of {', '.join(KINDS)}")
    if _SHARED is not None:
        _SHARED[key] = executor
    return executor

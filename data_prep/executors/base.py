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

from abc import ABC, abstractmethod
from typing import Any, Callable, List, Sequence, TypeVar

U = TypeVar("U")  # a work unit: anything with an ``index`` (read.units.Unit)


class WorkerDied:
    """The result ``on_result`` gets for a unit whose worker process died under it (the OOM killer, a signal, a
    memory limit): the unit failed, the other units carry on. ``why`` says how it died, for the failure record."""

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:
        return f"WorkerDied({self.why!r})"


class UnitsFailed(Exception):
    """A command (tokenize, curate) whose units did not all complete: `failed` lists them (unit, error), the message
    says what to rerun. The others are complete and a rerun keeps them."""

    def __init__(self, message: str, failed: List[dict]):
        super().__init__(message)
        self.failed = failed


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

"""Which executor runs a command's units: ``make_executor(kind, workers, address)``, and ``session()``, within which a
command of several passes shares one executor per kind and size. The one module that knows every executor (the
interface, base.py, knows none of them; Ray is imported only when asked for)."""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Optional, Tuple

from data_prep.executors.base import Executor
from data_prep.executors.local import LocalExecutor

KINDS = ("local", "ray")

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
        executor: Executor = LocalExecutor(workers)
    elif kind == "ray":
        from data_prep.executors.ray import RayExecutor

        executor = RayExecutor(workers, ray_address, keep=_SHARED is not None)
    else:
        raise ValueError(f"unknown executor {kind!r}: choose one of {', '.join(KINDS)}")
    if _SHARED is not None:
        _SHARED[key] = executor
    return executor

"""The internals of torch.distributed.pipelining this project leans on, in one module (as deepspeed_private is for
DeepSpeed): each function says what it relies on; tests/recipes/test_torch_private.py pins that behaviour, so a torch
upgrade that changes one of them fails one test named after it. Tested with torch 2.13.
"""
from __future__ import annotations

import functools
import time


class P2PWaitClock:
    """Seconds this process spent waiting for pipeline sends and receives (the schedule's blocked time: the bubble
    plus the transfers), between `start` and `stop`. Relies on every schedule of torch.distributed.pipelining waiting
    for its point-to-point work through the module function `schedules._wait_batch_p2p(works)`."""

    def __init__(self):
        self.seconds = 0.0
        self._on = False

    def install(self) -> "P2PWaitClock":
        from torch.distributed.pipelining import schedules

        wait = schedules._wait_batch_p2p
        if getattr(wait, "_p2p_clock", None) is self:
            return self

        @functools.wraps(wait)
        def timed_wait(work):
            if not self._on:
                return wait(work)
            t0 = time.perf_counter()
            try:
                return wait(work)
            finally:
                self.seconds += time.perf_counter() - t0

        timed_wait._p2p_clock = self
        schedules._wait_batch_p2p = timed_wait
        return self

    def start(self) -> None:
        self.seconds, self._on = 0.0, True

    def stop(self) -> float:
        self._on = False
        return self.seconds


P2P_WAIT_CLOCK = P2PWaitClock()  # one per process: the function it wraps is process-wide

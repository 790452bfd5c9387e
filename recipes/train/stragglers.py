"""Which rank is slow: per-rank compute time per step, gathered at the log interval, the slowest rank named.

In synchronous training a rank's wall time per step cannot name a slow rank: its fast peers wait for it inside the
collectives (TP all-reduces, pipeline send/recv, the ZeRO gradient reduction), so every rank's step takes as long as
the slowest one's. What differs is the time outside the collectives: forward/backward math, data loading, the
optimizer. So each rank measures its step's wall time minus the time it spent blocked inside torch.distributed
calls (`CommClock`: a clock around every collective and point-to-point call of torch.distributed, installed before
DeepSpeed and megatron-core bind them), and the rank with the largest remainder is the slow one.

On CPU (gloo) a blocking collective blocks the calling thread, so the wall clock around it is the wait; an async
call is timed from issue to return and again inside its `wait()`. On CUDA (NCCL) a collective returns before it
has run, so the clock records CUDA events on the current stream around it instead (the stream waits for the
collective there) and reads them at the end of the step. DeepSpeed's own comms logger was not used: it sees only
DeepSpeed's calls (not megatron-core's TP collectives) and synchronizes the device around each one.

Hosts: each rank's host name travels once at start as a fixed-size byte tensor (no pickled objects cross the
network, see recipes.train.collectives).
"""
from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import time

import torch
from torch.distributed import distributed_c10d as c10d

from recipes.train.collectives import all_gather_floats, all_gather_strings

logger = logging.getLogger(__name__)

# every torch.distributed call that can wait for another rank (the async ones return a Work to wait on)
# (torch 2.13's all_gather_single / reduce_scatter_single are what context parallelism's K/V gather calls)
_CALLS = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base",
          "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "reduce",
          "broadcast", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
          "all_to_all", "all_to_all_single", "gather", "scatter", "all_reduce_coalesced", "all_gather_coalesced")


class CommClock:
    """Seconds this process's training thread spent blocked inside torch.distributed calls, between `start` and
    `stop` (calls outside such a window, or from other threads, are not counted)."""

    def __init__(self, now=time.perf_counter):
        self._now = now  # the wall clock (a test passes its own)
        self._thread: int | None = None  # the thread of the open window; None: closed
        self._depth = 0  # a call made inside a timed call (all_gather_object -> all_gather) is not counted twice
        self._seconds = 0.0
        self._events: list = []  # CUDA: (start, end) event pairs of the open window
        self._cuda = False

    def install(self) -> "CommClock":
        """Wrap torch.distributed's calls, one wrapper under both names each has (torch.distributed.isend is
        c10d.isend: P2POp checks the op it is given against c10d's names); idempotent."""
        for name in _CALLS:
            fn = getattr(c10d, name, None) or getattr(torch.distributed, name, None)
            if fn is None or getattr(fn, "_comm_clock", False):
                continue
            timed = self._wrap(fn)
            for module in (torch.distributed, c10d):
                if getattr(module, name, None) is not None:
                    setattr(module, name, timed)
        return self

    def start(self, device: torch.device) -> None:
        self._thread, self._seconds, self._events = threading.get_ident(), 0.0, []
        self._cuda = device.type == "cuda"

    def stop(self) -> float:
        """Close the window: the seconds spent inside collectives in it."""
        self._thread = None
        seconds = self._seconds
        for begin, end in self._events:
            end.synchronize()
            seconds += begin.elapsed_time(end) / 1000
        self._events = []
        return seconds

    def _counting(self) -> bool:
        return self._thread == threading.get_ident() and not self._depth

    def _mark(self):
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self._now()

    def _add(self, mark) -> None:
        if self._cuda:
            self._events.append((mark, self._mark()))
        else:
            self._seconds += self._now() - mark

    def _timed(self, fn, *args, **kwargs):
        if not self._counting():
            return fn(*args, **kwargs)
        self._depth += 1
        mark = self._mark()
        try:
            return fn(*args, **kwargs)
        finally:
            self._depth -= 1
            self._add(mark)

    def _wrap(self, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            # inside torch.compile'd code (training.compile_decoder_layers) the call is traced as it is: no clock
            if torch.compiler.is_compiling() or not self._counting():
                return fn(*args, **kwargs)
            out = self._timed(fn, *args, **kwargs)
            if isinstance(out, list):  # batch_isend_irecv
                return [_TimedWork(w, self) for w in out]
            return _TimedWork(out, self) if hasattr(out, "wait") else out

        timed._comm_clock = True
        return timed


class _TimedWork:
    """An async call's handle whose `wait()` (where the rank waits for its peers) is on the clock."""

    def __init__(self, work, clock: CommClock):
        self._work, self._clock = work, clock

    def wait(self, *args, **kwargs):
        return self._clock._timed(self._work.wait, *args, **kwargs)

    def __getattr__(self, name):  # is_completed, get_future, result, ...: the handle's own
        return getattr(self._work, name)


COMM_CLOCK = CommClock()  # one per process: the collectives it wraps are process-wide


PERSIST = 3  # log intervals in a row a rank must lag before it is named (one slow interval is noise)


class StragglerReport:
    """Per-rank compute time per step (wall time minus time blocked in collectives), gathered across ranks at the
    log interval only (one float per rank): p50/p90/max over ranks for the metrics, and the slowest rank: the one
    furthest above the median of its pipeline stage (the ranks of a stage do the same work; stages differ, the last
    one computes the loss). Rank 0 names it in the log when it lags its stage's median by more than
    supervision.straggler_pct for PERSIST log intervals in a row."""

    def __init__(self, straggler_pct: float, world: int, device: torch.device, ranks_per_stage: int):
        self.pct, self.world, self.device, self.times = straggler_pct, world, device, []
        self.stages = [r // ranks_per_stage for r in range(world)]  # rank order tp-dp-pp: stages are the slowest
        self.streak = (None, 0)  # (rank, intervals in a row it lagged)
        self.hosts = None
        if world > 1:  # once at start: which host each rank is on, for the log line
            self.hosts = all_gather_strings(os.environ.get("LAUNCH_HOST", socket.gethostname()), world, device)

    def add(self, compute_seconds: float) -> None:
        self.times.append(compute_seconds)

    def gather(self) -> dict:
        """Collective (every rank, same steps). Returns the metrics fields; logs a straggler on rank 0."""
        mine = sum(self.times) / max(len(self.times), 1)
        self.times = []
        if self.world == 1:
            return {}
        per_rank = all_gather_floats(mine, self.world, self.device)
        ranked = sorted(per_rank)
        slowest, excess = slowest_rank(per_rank, self.stages)
        if torch.distributed.get_rank() == 0:
            self._maybe_name(slowest, excess, per_rank)
        return {"compute_time_p50_s": _nearest_rank(ranked, 0.5), "compute_time_p90_s": _nearest_rank(ranked, 0.9),
                "compute_time_max_s": ranked[-1], "slowest_rank": slowest}

    def _maybe_name(self, slowest: int, excess: float, per_rank: list[float]) -> None:
        lagging = excess > self.pct / 100
        rank, n = self.streak
        self.streak = (slowest, n + 1 if rank == slowest else 1) if lagging else (None, 0)
        if self.streak[1] == PERSIST:
            logger.warning(f"straggler: rank {slowest} on host {self.hosts[slowest]} computes "
                           f"{per_rank[slowest]:.3f} s per step, {100 * excess:.0f}% above the median of its pipeline "
                           f"stage, for {PERSIST} log intervals in a row (time outside collectives; "
                           f"supervision.straggler_pct = {self.pct:g})")


def slowest_rank(per_rank: list[float], stages: list[int]) -> tuple[int, float]:
    """The rank furthest above the median of its stage, and by how much (0.5 = 50% above)."""
    medians = {}
    for stage in set(stages):
        medians[stage] = _nearest_rank(sorted(t for t, s in zip(per_rank, stages) if s == stage), 0.5)
    excess = [t / medians[s] - 1 if medians[s] > 0 else 0.0 for t, s in zip(per_rank, stages)]
    rank = max(range(len(per_rank)), key=excess.__getitem__)
    return rank, excess[rank]


def _nearest_rank(ranked: list[float], q: float) -> float:
    return ranked[min(len(ranked) - 1, max(0, math.ceil(q * len(ranked)) - 1))]

"""Test-only fault injection: make one rank die, hang or run slow at a chosen step, to test the launcher's restarts,
its hang watchdog and the straggler report with real processes.

Set only by the tests, read once at rank start (never from a recipe or a file):
    RECIPES_TEST_FAULT="KIND rank=R step=S [host=H] [attempt=A] [seconds=X]"
KIND: kill (SIGKILL itself) | hang (sleeps forever) | slow (from step S on, every forward pass of the model on rank R
first sleeps X seconds, default 0.5: a rank slower than its peers).
The fault fires on global rank R (and only on host H, if given: a failing node; only in the launcher's attempt A,
if given: LAUNCH_ATTEMPT) when the loop is about to train step S (1-based). A run resumed past step S does not see
kill or hang again.
"""
from __future__ import annotations

import os
import signal
import time

ENV = "RECIPES_TEST_FAULT"
KINDS = ("kill", "hang", "slow")


class Fault:
    def __init__(self, kind: str, rank: int, step: int, host: str | None = None, attempt: str | None = None,
                 seconds: float = 0.5):
        self.kind, self.rank, self.step, self.host, self.attempt = kind, rank, step, host, attempt
        self.seconds = seconds
        self.slowing = False  # kind "slow": set once the step is reached

    @classmethod
    def from_env(cls) -> "Fault | None":
        spec = os.environ.get(ENV, "").strip()
        if not spec:
            return None
        kind, *pairs = spec.split()
        fields = dict(p.split("=", 1) for p in pairs if "=" in p)
        if kind not in KINDS or not {"rank", "step"} <= fields.keys() or len(fields) != len(pairs):
            raise ValueError(f"{ENV}={spec!r}: expected 'KIND rank=R step=S [host=H] [attempt=A] [seconds=X]' with "
                             f"KIND one of {KINDS}")
        return cls(kind, int(fields["rank"]), int(fields["step"]), fields.get("host"), fields.get("attempt"),
                   float(fields.get("seconds", 0.5)))

    def _targets(self, rank: int) -> bool:
        if rank != self.rank:
            return False
        if self.host is not None and os.environ.get("LAUNCH_HOST") != self.host:
            return False
        return self.attempt is None or os.environ.get("LAUNCH_ATTEMPT") == self.attempt

    def maybe_fire(self, rank: int, step: int) -> None:
        """Call with the 1-based number of the step about to be trained."""
        if self.kind == "slow":
            if not self.slowing and step >= self.step and self._targets(rank):
                print(f"{ENV}: rank {rank} runs {self.seconds:g} s slower per forward pass from step {step}",
                      flush=True)
                self.slowing = True
            return
        if step != self.step or not self._targets(rank):
            return
        print(f"{ENV}: rank {rank} {self.kind} at step {step}", flush=True)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        _hang_forever()

    def attach(self, module) -> None:
        """Kind "slow": every forward pass of `module` (each micro-batch) sleeps once the fault fired."""
        if self.kind == "slow":
            module.register_forward_pre_hook(self._slow_forward)

    def _slow_forward(self, module, args) -> None:
        if self.slowing:
            time.sleep(self.seconds)


def _hang_forever() -> None:
    """A rank stuck inside a step (the name the stack-dump test looks for)."""
    while True:
        time.sleep(3600)

"""Test-only fault injection: make one rank die or hang at a chosen step, to test the launcher's restarts and its
hang watchdog with real processes.

Set only by the tests, read once at rank start (never from a recipe or a file):
    RECIPES_TEST_FAULT="KIND rank=R step=S [host=H] [attempt=A]"   KIND: kill (SIGKILL itself) | hang (sleeps)
The fault fires on global rank R (and only on host H, if given: a failing node; only in the launcher's attempt A,
if given: LAUNCH_ATTEMPT) when the loop is about to train step S (1-based). A run resumed past step S does not see
it again.
"""
from __future__ import annotations

import os
import signal
import time

ENV = "RECIPES_TEST_FAULT"
KINDS = ("kill", "hang")


class Fault:
    def __init__(self, kind: str, rank: int, step: int, host: str | None = None, attempt: str | None = None):
        self.kind, self.rank, self.step, self.host, self.attempt = kind, rank, step, host, attempt

    @classmethod
    def from_env(cls) -> "Fault | None":
        spec = os.environ.get(ENV, "").strip()
        if not spec:
            return None
        kind, *pairs = spec.split()
        fields = dict(p.split("=", 1) for p in pairs if "=" in p)
        if kind not in KINDS or not {"rank", "step"} <= fields.keys() or len(fields) != len(pairs):
            raise ValueError(f"{ENV}={spec!r}: expected 'KIND rank=R step=S [host=H] [attempt=A]' with KIND one of "
                             f"{KINDS}")
        return cls(kind, int(fields["rank"]), int(fields["step"]), fields.get("host"), fields.get("attempt"))

    def maybe_fire(self, rank: int, step: int) -> None:
        """Call with the 1-based number of the step about to be trained."""
        if rank != self.rank or step != self.step:
            return
        if self.host is not None and os.environ.get("LAUNCH_HOST") != self.host:
            return
        if self.attempt is not None and os.environ.get("LAUNCH_ATTEMPT") != self.attempt:
            return
        print(f"{ENV}: rank {rank} {self.kind} at step {step}", flush=True)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        _hang_forever()


def _hang_forever() -> None:
    """A rank stuck inside a step (the name the stack-dump test looks for)."""
    while True:
        time.sleep(3600)

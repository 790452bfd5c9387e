"""Pre-emption signals (SIGTERM, SIGUSR1): remembered from the moment a rank starts (`install` is the worker's first
act), so one that arrives during start-up still ends in a checkpoint and a clean exit, not a rank killed by it."""
from __future__ import annotations

import signal

_requested = False


def _remember(signum, frame) -> None:
    global _requested
    _requested = True


def install() -> None:
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, _remember)


def requested() -> bool:
    return _requested


class StopRequest:
    """SIGTERM / SIGUSR1 (pre-emption) ask for a checkpoint and a clean exit at the end of the current step."""

    def __init__(self):
        install()  # already installed by the entry point; again for callers that start here

    @property
    def flag(self) -> bool:
        return requested()

    def agreed(self, device) -> bool:
        """Collective: stop if any rank got the signal."""
        import torch

        t = torch.tensor([1.0 if self.flag else 0.0], device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())

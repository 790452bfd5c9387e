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

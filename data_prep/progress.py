"""Progress for long runs: MB/s, documents/s, tokens/s and ETA on one tqdm bar (stderr); silent with --quiet.

Tasks report ``(unit index, documents, tokens, characters)`` with ``report``; their executor connects them to the
driver's bar (``set_channel`` in each worker, ``Progress.drain`` in the driver). Without a channel (Ray tasks) the bar
advances only as units finish."""

from __future__ import annotations

import logging
import queue as queue_mod
import sys
import time

log = logging.getLogger(__name__)

# --- task side ---------------------------------------------------------------------------------------------------

_channel = None  # a queue to the driver's bar, set in each worker by its executor


def set_channel(q) -> None:
    global _channel
    _channel = q


def watched() -> bool:
    return _channel is not None


def report(unit: int, docs: int, tokens: int, chars: int) -> None:
    if _channel is not None:
        _channel.put((unit, docs, tokens, chars))


# --- driver side -------------------------------------------------------------------------------------------------


class Progress:
    """The bar counts input bytes: a finished unit adds its input size; a unit in flight adds the text it has read
    so far, capped at its input size (text outgrows compressed input, so without the cap a .zst corpus would show
    100% at a quarter of the way; with it, the error is bounded by the units in flight)."""

    def __init__(self, unit_bytes: dict, quiet: bool = False, desc: str = "tokenize"):
        self.quiet, self.desc = quiet, desc
        self.unit_bytes = dict(unit_bytes)  # unit index -> input bytes
        self.total = sum(self.unit_bytes.values())
        self.start = time.monotonic()
        self.docs = self.tokens = self.chars = 0
        self.done_bytes = 0
        self.inflight: dict = {}  # unit index -> text characters read so far
        self.bar = None
        if not quiet:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="B", unit_scale=True, file=sys.stderr,
                            desc=desc, dynamic_ncols=True, mininterval=0.5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
            el = max(time.monotonic() - self.start, 1e-9)
            print(f"{self.desc}: {self.docs:,} docs, {self.tokens:,} tokens in {el:.1f}s: {self.docs / el:,.0f} docs/s, "
                  f"{self.tokens / el:,.0f} tokens/s, {self.chars / el / 1e6:.2f} MB/s (text)", file=sys.stderr)

    @property
    def position(self) -> int:
        """Input bytes counted as done (what the bar shows)."""
        return self.done_bytes + sum(min(c, self.unit_bytes.get(u, 0)) for u, c in self.inflight.items())

    def _show(self) -> None:
        if self.bar is not None and self.position > self.bar.n:
            self.bar.update(self.position - self.bar.n)

    def _update(self, unit, d, t, c):
        self.docs += d
        self.tokens += t
        self.chars += c
        self.inflight[unit] = self.inflight.get(unit, 0) + c
        self._show()
        if self.bar is not None:
            el = max(time.monotonic() - self.start, 1e-9)
            self.bar.set_postfix_str(f"{self.docs / el:,.0f} docs/s {self.tokens / el:,.0f} tok/s", refresh=False)

    def drain(self, q, timeout: float = 0.0) -> None:
        try:
            item = q.get(timeout=timeout) if timeout else q.get_nowait() if hasattr(q, "get_nowait") else q.get()
            self._update(*item)
            while True:
                self._update(*q.get_nowait())
        except (queue_mod.Empty, EOFError, OSError):
            pass

    def unit_done(self, unit: int) -> None:
        self.inflight.pop(unit, None)
        self.done_bytes += self.unit_bytes.get(unit, 0)
        self._show()

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            log.warning(msg)

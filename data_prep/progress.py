"""Progress for long runs: MB/s, documents/s, tokens/s and ETA on one tqdm bar (stderr); silent with --quiet."""

from __future__ import annotations

import queue as queue_mod
import sys
import time


class Progress:
    def __init__(self, total_bytes: int, quiet: bool = False):
        self.quiet = quiet
        self.total = total_bytes
        self.start = time.monotonic()
        self.docs = self.tokens = self.chars = 0
        self.done_bytes = 0
        self.bar = None
        if not quiet:
            from tqdm import tqdm

            self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, file=sys.stderr,
                            desc="tokenize", dynamic_ncols=True, mininterval=0.5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
            el = max(time.monotonic() - self.start, 1e-9)
            print(f"tokenize: {self.docs:,} docs, {self.tokens:,} tokens in {el:.1f}s: {self.docs / el:,.0f} docs/s, "
                  f"{self.tokens / el:,.0f} tokens/s, {self.chars / el / 1e6:.2f} MB/s (text)", file=sys.stderr)

    def _update(self, d, t, c):
        self.docs += d
        self.tokens += t
        self.chars += c
        if self.bar is not None:
            step = min(c, max(self.total - self.bar.n, 0))
            self.bar.update(step)
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

    def unit_done(self, nbytes: int) -> None:
        if self.bar is not None:
            self.done_bytes += nbytes
            if self.bar.n < self.done_bytes:
                self.bar.update(self.done_bytes - self.bar.n)

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr)

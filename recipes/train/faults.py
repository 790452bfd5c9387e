"""Test-only fault injection: make one rank die, hang or run slow at a chosen step, to test the launcher's restarts,
its hang watchdog and the straggler report with real processes.

Set only by the tests, read once at rank start (never from a recipe or a file):
    RECIPES_TEST_FAULT="KIND rank=R step=S [host=H] [attempt=A] [seconds=X] [touch=PATH]"
KIND: kill (SIGKILL itself) | hang (sleeps forever) | slow (from step S on, every forward pass of the model on rank R
first sleeps X seconds, default 0.5: a rank slower than its peers).
The fault fires on global rank R (and only on host H, if given: a failing node; only in the launcher's attempt A,
if given: LAUNCH_ATTEMPT) when the loop is about to train step S (1-based). A run resumed past step S does not see
kill or hang again. `touch=PATH` creates PATH just before a kill (a test's signal that the node is now gone for good,
e.g. to its ssh config).
"""
from __future__ import annotations

import os
import signal
import time

ENV = "RECIPES_TEST_FAULT"
KINDS = ("kill", "hang", "slow")


class Fault:
    def __init__(self, kind: str, rank: int, step: int, host: str | None = None, attempt: str | None = None,
                 seconds: float = 0.5, touch: str | None = None):
        self.kind, self.rank, self.step, self.host, self.attempt = kind, rank, step, host, attempt
        self.seconds, self.touch = seconds, touch
        self.slowing = False  # kind "slow": set once the step is reached

    @classmethod
    def from_env(cls) -> "Fault | None":
        spec = os.environ.get(ENV, "").strip()
        if not spec:
            return None
        kind, *pairs = spec.split()
        fields = dict(p.split("=", 1) for p in pairs if "=" in p)
        if kind not in KINDS or not {"rank", "step"} <= fields.keys() or len(fields) != len(pairs):
            raise ValueError(f"{ENV}={spec!r}: expected 'KIND rank=R step=S [host=H] [attempt=A] [seconds=X] "
                             f"[touch=PATH]' with KIND one of {KINDS}")
        return cls(kind, int(fields["rank"]), int(fields["step"]), fields.get("host"), fields.get("attempt"),
                   float(fields.get("seconds", 0.5)), fields.get("touch"))

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
            if self.touch:
                open(self.touch, "a").close()
            os.kill(os.getpid(), signal.SIGKILL)
        _hang_forever()

    def attach(self, module) -> None:
        """Kind "slow": every forward pass of `module` (each micro-batch) sleeps once the fault fired. A pipeline
        rank's layers run chunk by chunk, not through the module's own forward: its first layer is hooked instead."""
        if self.kind == "slow":
            first = min(module.named_children(), key=lambda c: int(c[0]))[1] if hasattr(module, "run") else module
            first.register_forward_pre_hook(self._slow_forward)

    def _slow_forward(self, module, args) -> None:
        if self.slowing:
            time.sleep(self.seconds)


DELAY_ENV = "RECIPES_TEST_LAYER_SECONDS"


class LayerDelays:
    """Test-only fixed compute time per decoder layer, to measure a pipeline schedule's bubble against its formula
    where real compute is too small and too noisy (the CPU tests' tiny model):
        RECIPES_TEST_LAYER_SECONDS="F,B,W"
    every decoder layer sleeps F seconds in its forward, B when the gradient of its output arrives (the input half of
    its backward) and W when the gradient of its weights is computed (the weight half, which a zero-bubble schedule
    runs apart). Read once at rank start, never from a recipe or a file."""

    def __init__(self, forward: float = 0.0, backward_input: float = 0.0, backward_weight: float = 0.0):
        self.f, self.b, self.w = forward, backward_input, backward_weight

    @classmethod
    def from_env(cls) -> "LayerDelays":
        spec = os.environ.get(DELAY_ENV, "").strip()
        if not spec:
            return cls()
        try:
            f, b, w = (float(x) for x in spec.split(","))
        except ValueError:
            raise ValueError(f"{DELAY_ENV}={spec!r}: expected 'F,B,W' (seconds)") from None
        return cls(f, b, w)

    def attach(self, module) -> None:
        if not (self.f or self.b or self.w):
            return
        for layer in module.modules():
            if type(layer).__name__.endswith("DecoderLayerPipe"):
                layer.register_forward_hook(self._forward)
                weight = next(p for p in layer.parameters() if p.dim() >= 2)
                weight.register_hook(self._weight_grad)

    def _forward(self, module, args, out) -> None:
        time.sleep(self.f)
        hidden = out[0] if isinstance(out, tuple) else out
        if self.b and hidden.requires_grad:
            hidden.register_hook(self._input_grad)

    def _input_grad(self, grad):
        time.sleep(self.b)

    def _weight_grad(self, grad):
        time.sleep(self.w)


def _hang_forever() -> None:
    """A rank stuck inside a step (the name the stack-dump test looks for)."""
    while True:
        time.sleep(3600)

"""Import megatron-core without importing torch's compiler at the same time.

megatron-core decorates its fusion functions (bias-GeLU/GeGLU/SwiGLU, RoPE, bias-dropout-add, ...) with
`torch.compile` as its modules are imported (`megatron.core.jit.jit_fuser = torch.compile`). `torch.compile(fn)`
compiles nothing until the first call, but it imports torch._dynamo and torch._inductor at once: ~3 s of CPU in every
rank, for functions a run calls only with fusions on (CUDA runs, `recipes.model.fast_path`; the CPU path turns them
off). Measured here, the imports a rank makes before it trains: 8.1-8.2 -> 5.0-5.7 CPU s.

`import_megatron_core()` swaps `torch.compile`, only while megatron-core's package is imported, for `deferred_compile`:
the first call of a decorated function runs exactly `torch.compile(fn, **options)` and uses that from then on. The
compiled function and the moment it is compiled (its first call) are what they were; only the compiler's import moves
there. tests/recipes/test_megatron_import.py pins the megatron-core behaviour this relies on.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
import threading


def deferred_compile(compile_fn):
    """A stand-in for `compile_fn` (torch.compile) that compiles a plain function at its first call, not before."""

    def compile_later(model=None, **options):
        if model is None:  # used as @torch.compile(**options)
            return lambda fn: compile_later(fn, **options)
        if not inspect.isfunction(model):  # modules and other callables: as torch.compile does it, now
            return compile_fn(model, **options)
        lock = threading.Lock()
        compiled = None

        @functools.wraps(model)
        def first_call_compiles(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                with lock:
                    if compiled is None:
                        compiled = compile_fn(model, **options)
            return compiled(*args, **kwargs)

        return first_call_compiles

    return compile_later


def import_megatron_core() -> None:
    """Import `megatron.core` (the whole package, as any of its modules does) with its torch.compile decorations left
    to the decorated functions' first calls. A no-op when it is already imported."""
    if "megatron.core" in sys.modules:
        return
    import torch

    real = torch.compile
    torch.compile = deferred_compile(real)
    try:
        importlib.import_module("megatron.core")
    finally:
        torch.compile = real

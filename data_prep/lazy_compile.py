"""Import the libraries that call `torch.compile` as they are imported, without importing torch's compiler then.

megatron-core decorates its fusion functions (bias-GeLU/GeGLU/SwiGLU, RoPE, bias-dropout-add, ...) with
`torch.compile` when its package is imported (`megatron.core.jit.jit_fuser = torch.compile`), and DeepSpeed its Muon
optimizer's steps (imported by every engine's optimizer check). `torch.compile(fn)` compiles nothing until the first
call, but it imports torch._inductor at once: ~2 s of CPU in every rank, for functions a run calls only with fusions on
(CUDA runs, `recipes.model.fast_path`; the CPU path turns them off) or with Muon. data_prep pays it too where it
opens shards with megatron-core's reader (`verify`, `stats`): ~3 s of a 6 s `data_prep verify`.
It lives here, in data_prep's bottom layer, so that both packages use it (recipes imports data_prep, not the reverse).

`import_with_compile_deferred()` swaps `torch.compile`, only while those modules are imported, for
`deferred_compile(torch.compile)`: the first call of a decorated function runs exactly `torch.compile(fn, **options)`
and uses that from then on. The compiled function and the moment it is compiled (its first call) are what they were;
only the compiler's import moves there. tests/training/test_local_fork.py checks in a fresh interpreter that a rank's
imports leave the compiler unimported (so a library upgrade that compiles at import elsewhere shows there).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
import threading

# The library modules that call torch.compile at import time (megatron-core's __init__ imports all its fusions).
COMPILING_AT_IMPORT = ("megatron.core", "deepspeed.runtime.zero.muon.muon_optimizer")
# Optional libraries megatron-core imports, where installed, for its own logging (its timers' and inference engine's
# `try: import wandb`, its timers' `try: from torch.utils.tensorboard import SummaryWriter`), which this project does
# not use: recipes.train.tracking and recipes.train.metrics import them when a run logs there (TensorBoard: one rank).
# Hidden while those modules are imported (their `except ImportError` branch): megatron-core's import 1.7-2.1 ->
# 1.1-1.4 s of CPU without TensorBoard (which pulls in boto3) and ~0.5 s less without wandb, in every rank. Not by a
# lazy module: torch's op registration scans every module's __file__ (inspect.getmodule) during the import.
HIDDEN_WHILE_IMPORTING = ("wandb", "torch.utils.tensorboard")


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


def import_with_compile_deferred(names: tuple[str, ...] = COMPILING_AT_IMPORT) -> None:
    """Import `names` (those not imported yet) with their torch.compile decorations left to the decorated functions'
    first calls, and without HIDDEN_WHILE_IMPORTING."""
    missing = [name for name in names if name not in sys.modules]
    if not missing:
        return
    import torch

    hidden = [name for name in HIDDEN_WHILE_IMPORTING if name not in sys.modules]
    real = torch.compile
    torch.compile = deferred_compile(real)
    sys.modules.update(dict.fromkeys(hidden))  # None: `import name` raises ImportError
    try:
        for name in missing:
            importlib.import_module(name)
    finally:
        torch.compile = real
        for name in hidden:
            sys.modules.pop(name, None)


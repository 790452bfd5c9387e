"""Read checkpoint files as data, never as code.

`torch.load(weights_only=False)` unpickles arbitrary objects, and unpickling can call any function the file names
(`__reduce__`): a checkpoint copied from elsewhere could run commands in export, reshape or resume. Every checkpoint
read here goes through `load`, which uses torch's weights-only unpickler (tensors, containers, numbers, strings)
plus an allow-list of the few plain-data classes DeepSpeed itself stores in its files (checked on ZeRO-0/1/3,
pipeline and fp16 checkpoints of DeepSpeed 0.19: the loss scaler, the ZeRO stage enum, the bf16/ZeRO parameter
fragment map). `guard_engine` routes DeepSpeed's own loads (model, layer and optimizer files on resume) through it.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file that asks the unpickler to build something other than data."""


def _deepspeed_classes() -> list:
    # Only classes whose pickled state is plain attributes (no code runs on load beyond setting __dict__).
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def _legacy_numpy_rng() -> list:
    # RNG files written before RNG states were saved as tensors hold numpy's MT19937 key as an ndarray; numpy's
    # array reconstructor builds data only (torch documents it as safe to allow).
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def allowed_globals(legacy_rng: bool = False) -> list:
    return _deepspeed_classes() + (_legacy_numpy_rng() if legacy_rng else [])


def load(path: str | Path, map_location="cpu", legacy_rng: bool = False, mmap: bool = False):
    """torch.load with weights_only=True and the allow-list; UnsafeCheckpointError naming the file otherwise.
    mmap=True maps the tensors' bytes instead of reading them (the streaming re-layout reads slices of big files)."""
    with torch.serialization.safe_globals(allowed_globals(legacy_rng)):
        try:
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            if "Weights only load failed" not in str(e):
                raise
            names = _unsafe_names(path)
            raise UnsafeCheckpointError(
                f"{path}: refused to load: the file asks to build {', '.join(names) or 'a non-data object'}, which "
                "could run code. A checkpoint must hold only tensors and plain data; do not load files from a "
                "source you do not trust. If this is a class that a newer DeepSpeed stores in its own files, read "
                "what it does and add it to recipes/checkpoint/safe_load.py's allow-list.") from None


def _unsafe_names(path) -> list[str]:
    try:  # reads the pickle's opcodes only, builds nothing
        allowed = {f"{g.__module__}.{g.__qualname__}" for g in allowed_globals(legacy_rng=True)}
        return [n for n in torch.serialization.get_unsafe_globals_in_checkpoint(path) if n not in allowed]
    except Exception:
        return []


def guard_engine(engine) -> None:
    """Route DeepSpeed's own checkpoint reads of this engine (model, layer, optimizer files) through `load`."""
    ce = getattr(engine, "checkpoint_engine", None)
    if ce is None or getattr(ce, "_recipes_safe", False):
        return

    def safe(path, map_location=None):
        return load(path, map_location=map_location)

    ce.load = safe
    ce._recipes_safe = True


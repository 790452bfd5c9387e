"""Read checkpoint files as data, never as code.

`torch.load(weights_only=False)` unpickles arbitrary objects, and unpickling can call any function the file names
(`__reduce__`): a checkpoint copied from elsewhere could run commands in export, reshape or resume. Every checkpoint
read here goes through `load`, which uses torch's weights-only unpickler (tensors, containers, numbers, strings)
plus an allow-list of the few plain-data classes DeepSpeed itself stores in its files (checked on ZeRO-0/1/3,
pipeline and fp16 checkpoints of DeepSpeed 0.19: the loss scaler, the ZeRO stage enum, the bf16/ZeRO parameter
fragment map).

`guard_torch_load` makes that a property of the process rather than of each call site: it replaces `torch.load`
itself, so DeepSpeed's checkpoint engines, megatron-core, transformers and any later code path read data only,
whatever `weights_only` they ask for. `recipes/__init__.py` installs it the moment torch is imported in any process
of the project (recipes.torch_guard), so no engine, tool or new reader can bypass it.
"""
from __future__ import annotations

import functools
import pickle
from pathlib import Path

import torch

from recipes.checkpoint.format import checksums


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


def _real_torch_load():
    """torch's own loader (the one `guard_torch_load` wraps)."""
    return getattr(torch.load, "_recipes_original", torch.load)


def load(path: str | Path, map_location="cpu", legacy_rng: bool = False, mmap: bool = False):
    """torch.load with weights_only=True and the allow-list; UnsafeCheckpointError naming the file otherwise.
    mmap=True maps the tensors' bytes instead of reading them (the streaming re-layout reads slices of big files)."""
    return _data_only(path, map_location, legacy_rng, mmap)


def _data_only(f, map_location, legacy_rng: bool = False, mmap: bool | None = None):
    kwargs = {} if mmap is None else {"mmap": mmap}
    if isinstance(f, (str, Path)):
        checksums.verify(f)  # a damaged file (same size, other bytes) is refused, not loaded
    with torch.serialization.safe_globals(allowed_globals(legacy_rng)):
        try:
            return _real_torch_load()(f, map_location=map_location, weights_only=True, **kwargs)
        except pickle.UnpicklingError as e:
            if "Weights only load failed" not in str(e):
                raise
            names = _unsafe_names(f)
            raise UnsafeCheckpointError(
                f"{_name_of(f)}: refused to load: the file asks to build {', '.join(names) or 'a non-data object'}, "
                "which could run code. A checkpoint must hold only tensors and plain data; do not load files from a "
                "source you do not trust. If this is a class that a newer DeepSpeed stores in its own files, read "
                "what it does and add it to recipes/checkpoint/safe_load.py's allow-list.") from None


def _name_of(f) -> str:
    return str(f) if isinstance(f, (str, Path)) else str(getattr(f, "name", "a checkpoint stream"))


def _unsafe_names(f) -> list[str]:
    if not isinstance(f, (str, Path)):
        return []
    try:  # reads the pickle's opcodes only, builds nothing
        allowed = {f"{g.__module__}.{g.__qualname__}" for g in allowed_globals(legacy_rng=True)}
        return [n for n in torch.serialization.get_unsafe_globals_in_checkpoint(f) if n not in allowed]
    except Exception:
        return []


def guard_torch_load() -> None:
    """Replace torch.load (and torch.serialization.load) with the data-only loader, for the whole process. Callers
    asking for weights_only=False (DeepSpeed's checkpoint engines, zero_to_fp32, older transformers paths) get the
    same data a weights-only load gives, or an UnsafeCheckpointError naming the file; the pickle never runs."""
    if getattr(torch.load, "_recipes_original", None) is not None:
        return
    original = torch.load

    @functools.wraps(original)
    def data_only_load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **_):
        return _data_only(f, map_location, mmap=mmap)

    data_only_load._recipes_original = original
    torch.load = data_only_load
    torch.serialization.load = data_only_load


guard_torch_load()  # importing this module guards the process too (it may be what imported torch first)

"""Each rank's RNG states beside DeepSpeed's files (`<tag>/rng_rank<R>.pt`), so that a resumed run draws the same
numbers (dropout, data order) as the uninterrupted one. Tensors and plain numbers only, so that resume reads the
file with weights_only=True (recipes.checkpoint.safe_load)."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from recipes.checkpoint import safe_load


def rng_file(tag_dir: Path, rank: int) -> Path:
    return tag_dir / f"rng_rank{rank}.pt"


def rng_state() -> dict:
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(),  # (version, tuple of ints, float | None)
             "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    if isinstance(n, dict):
        np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    else:  # a tuple with an ndarray: written before RNG states were tensors
        np.random.set_state(n)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def restore(tag_dir: Path, rank: int) -> None:
    """Set this rank's RNG states from its file of `tag_dir`, if there is one."""
    path = rng_file(tag_dir, rank)
    if path.is_file():
        set_rng_state(safe_load.load(path, legacy_rng=True))

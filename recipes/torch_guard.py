"""Every process of the project reads `.pt` files as data only, from the moment torch is imported.

`recipes/__init__.py` calls `guard_torch_on_import()`: if torch is already imported, torch.load is replaced now;
otherwise a one-shot import hook replaces it right after torch's own import finishes, whoever imports torch first
(a rank, DeepSpeed, transformers, a checkpoint writer process). The replacement is
recipes.checkpoint.safe_load.guard_torch_load. This module imports nothing heavy: `recipes plan` never imports torch.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def guard_torch_on_import() -> None:
    if "torch" in sys.modules:
        _guard()
    elif not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds torch through the other finders, then runs the guard once torch's module has finished executing."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once, and no recursion into this finder below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _guard()

        spec.loader.exec_module = exec_module
        return spec


def _guard() -> None:
    loading = sys.modules.get("recipes.checkpoint.safe_load")
    if loading is not None and not hasattr(loading, "guard_torch_load"):
        return  # torch was imported by safe_load itself, which guards torch.load as its import ends
    from recipes.checkpoint.safe_load import guard_torch_load

    guard_torch_load()

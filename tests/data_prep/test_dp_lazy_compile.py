"""data_prep.lazy_compile: a function decorated while megatron-core or DeepSpeed is imported is compiled by the real
torch.compile, with the decorator's options, at its first call and only then; its results are the function's.
(That a rank's imports leave torch's compiler unimported is checked in a fresh interpreter by test_local_fork.)"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from data_prep.lazy_compile import deferred_compile

pytestmark = pytest.mark.unit


def _gated(y):
    a, b = torch.chunk(y, 2, -1)
    return torch.tanh(a) * b


def test_a_deferred_function_is_compiled_at_its_first_call_with_its_options():
    torch._dynamo.reset()
    counters.clear()
    compile_later = deferred_compile(torch.compile)
    fn = compile_later(_gated, backend="eager")
    decorator_form = compile_later(backend="eager", dynamic=False)(_gated)
    assert counters["stats"]["calls_captured"] == 0  # nothing traced at decoration
    assert fn.__wrapped__ is _gated and fn.__name__ == "_gated"
    y = torch.randn(3, 8)
    assert torch.equal(fn(y), _gated(y))
    captured = counters["stats"]["calls_captured"]
    assert captured > 0  # dynamo traced it: the real torch.compile ran at the first call
    assert torch.equal(fn(y), _gated(y)) and counters["stats"]["calls_captured"] == captured  # compiled once
    assert torch.equal(decorator_form(y), _gated(y)) and counters["stats"]["calls_captured"] > captured


def test_a_module_is_compiled_at_once_as_torch_compile_does_it():
    module = torch.nn.Linear(4, 4)
    compiled = deferred_compile(torch.compile)(module, backend="eager")
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled._orig_mod is module


def test_optional_imports_are_hidden_only_while_the_library_is_imported(tmp_path, monkeypatch):
    """What megatron-core does with wandb (`try: import wandb / except ImportError: wandb = None`), with a small
    installed module in wandb's place: the library sees it missing, and it imports normally afterwards."""
    import importlib
    import sys

    from data_prep import lazy_compile

    (tmp_path / "lib_with_optional_logging.py").write_text(
        "try:\n    import colorsys as optional\nexcept ImportError:\n    optional = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(lazy_compile, "HIDDEN_WHILE_IMPORTING", ("colorsys",))
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    monkeypatch.delitem(sys.modules, "lib_with_optional_logging", raising=False)
    lazy_compile.import_with_compile_deferred(("lib_with_optional_logging",))
    assert sys.modules["lib_with_optional_logging"].optional is None
    assert "colorsys" not in sys.modules
    assert importlib.import_module("colorsys").hsv_to_rgb(0, 0, 1) == (1, 1, 1)

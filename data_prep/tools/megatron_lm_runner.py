"""Runs Megatron-LM's tools/preprocess_data.py for the bench: ``python -m data_prep.tools.megatron_lm_runner
PATH/tools/preprocess_data.py ARGS...`` (with the checkout on PYTHONPATH).

megatron.training.initialize (and, on Megatron-LM main, megatron.core's inference MoE code) imports one kernel module
that imports triton at the top. When triton is not importable (CPU machines usually lack it; preprocessing never calls
a kernel), that one module is replaced by one whose every name is a no-op before the script runs; when it is
(`pip install triton`: the Linux wheel imports without a GPU), the script runs with its real imports, start-up
cost included. Megatron-LM main also asks for Python >= 3.12 only for ``typing.override``, given here from
typing_extensions on older Pythons. Nothing else is changed: the script, its tokenizers and its worker pool are
Megatron-LM's own.
"""

import importlib.util
import runpy
import sys
import types


def _stub_kernels() -> None:
    name = "megatron.core.transformer.custom_layers.batch_invariant_kernels"
    stub = types.ModuleType(name)
    stub.enable_batch_invariant_mode = lambda *a, **k: None

    def any_kernel(attr):  # any other kernel it names (PEP 562); dunder lookups (inspect's) are not kernels
        if attr.startswith("__"):
            raise AttributeError(attr)
        return lambda *a, **k: None

    stub.__getattr__ = any_kernel
    sys.modules[name] = stub


if __name__ == "__main__":
    if importlib.util.find_spec("triton") is None:
        _stub_kernels()
    import typing

    if not hasattr(typing, "override"):  # Megatron-LM main names typing.override (Python 3.12); same decorator
        import typing_extensions

        typing.override = typing_extensions.override
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")

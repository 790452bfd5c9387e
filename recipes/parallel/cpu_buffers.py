"""Sequence parallelism on CPU ranks: megatron-core's sequence-parallel collectives allocate their outputs on
`torch.cuda.current_device()`, which a CPU process does not have.

megatron-core 0.16.1 allocates in three places on the sequence-parallel path:
  * `parallel_state`'s GlobalMemoryBuffer (the all-gather buffer of `ColumnParallelLinear` under SP, forward and
    backward): replaced by one that allocates on the CPU;
  * `tensor_parallel.mappings._gather_along_first_dim` / `_reduce_scatter_along_first_dim` (entering / leaving the
    SP region) and the reduce-scatter output of the linear's backward (`tensor_parallel.layers`): these modules ask
    `torch.cuda.current_device()` for the device, so they are given a view of `torch` whose `cuda.current_device()`
    answers "cpu" (everything else is torch itself).

Only those two megatron modules and the buffer are touched, only in a CPU run with sequence parallelism, and only
allocation changes: the collectives are the same gloo calls (all_gather_into_tensor, reduce_scatter_tensor), so the
CPU tests run the code path a GPU run takes.
"""
from __future__ import annotations

import types

import torch

_CPU = torch.device("cpu")


class _CudaOnCpu:
    """`torch.cuda` for a CPU process: the current device is the CPU; anything else is torch.cuda's own."""

    def current_device(self):
        return _CPU

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


class _TorchOnCpu(types.ModuleType):
    """`torch` whose `cuda.current_device()` is the CPU (see the module docstring)."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = _CudaOnCpu()

    def __getattr__(self, name):
        return getattr(torch, name)


def _cpu_memory_buffer():
    from megatron.core.utils import GlobalMemoryBuffer

    class CpuMemoryBuffer(GlobalMemoryBuffer):
        """megatron-core's named, reused buffers, allocated on the CPU."""

        def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
            numel = 1
            for n in tensor_shape:
                numel *= n
            held = self.buffer.get((name, dtype))
            if held is None or held.numel() < numel:
                self.buffer[(name, dtype)] = held = torch.empty(numel, dtype=dtype, device=_CPU)
            return held[:numel].view(*tensor_shape)

    return CpuMemoryBuffer()


def place_sequence_parallel_buffers_on_cpu() -> None:
    """Let megatron-core's sequence-parallel linears and mappings run in this CPU process. Call after
    `parallel_state.initialize_model_parallel` (which creates the buffer) and before the first forward."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import layers, mappings

    parallel_state._GLOBAL_MEMORY_BUFFER = _cpu_memory_buffer()
    for module in (mappings, layers):
        if not isinstance(module.torch, _TorchOnCpu):
            module.torch = _TorchOnCpu()

"""Shared fixtures of the GPU tests."""
from __future__ import annotations

import os
import socket

import pytest
import torch


@pytest.fixture
def tp1_group():
    """A one-process gloo group and megatron-core's parallel state at TP=PP=1, for layers tested on their own."""
    from megatron.core import parallel_state

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    yield
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()

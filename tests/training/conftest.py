"""Fixtures of the multi-process CPU training tests; the helpers live in tests/support/runs.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.corpus import write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def short_doc_corpus(tmp_path_factory) -> Path:
    """Documents of at most 40 bytes: every 64-token sample of the tiny recipe packs two or more of them."""
    return write_corpus(tmp_path_factory.mktemp("short_docs"), max_bytes=100_000, doc_bytes=40)


@pytest.fixture(scope="module")
def single_process_group():
    from megatron.core import parallel_state

    # Another in-process test (e.g. the HF export checks) may already hold a world of one: reuse it, and tear down
    # only what this fixture made.
    made_world = not torch.distributed.is_initialized()
    if made_world:
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    made_groups = not parallel_state.model_parallel_is_initialized()
    if made_groups:
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    assert torch.distributed.get_world_size() == 1 and parallel_state.get_tensor_model_parallel_world_size() == 1
    yield
    if made_groups:
        parallel_state.destroy_model_parallel()
    if made_world:
        torch.distributed.destroy_process_group()

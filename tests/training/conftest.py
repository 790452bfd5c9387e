"""Fixtures of the multi-process CPU training tests; the helpers live in tests/support/runs.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.corpus import write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))

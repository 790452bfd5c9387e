"""Executors shared by the passes of one command (data_prep.executors.base.session): one per kind and size, closed
once at the end; without a session each call gets its own."""
from __future__ import annotations

import pytest

from data_prep.executors import base

pytestmark = pytest.mark.unit


def test_a_session_shares_one_executor_per_kind_and_closes_each_once(monkeypatch):
    closed = []
    monkeypatch.setattr(base.Executor, "close", lambda self: closed.append(self))
    with base.session():
        a, b, c = base.make_executor("local", 2), base.make_executor("local", 2), base.make_executor("local", 1)
        with base.session():  # nested: the outer one owns them
            assert base.make_executor("local", 2) is a
        assert not closed
    assert a is b and c is not a
    assert sorted(map(id, closed)) == sorted(map(id, (a, c)))
    assert base.make_executor("local", 2) is not base.make_executor("local", 2)  # no session: one each


def test_a_session_closes_its_executors_when_the_command_fails(monkeypatch):
    closed = []
    monkeypatch.setattr(base.Executor, "close", lambda self: closed.append(self))
    with pytest.raises(RuntimeError, match="a pass failed"):
        with base.session():
            base.make_executor("local", 1)
            raise RuntimeError("a pass failed")
    assert len(closed) == 1 and base._SHARED is None

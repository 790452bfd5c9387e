"""Executors shared by the passes of one command (data_prep.executors.choose.session): one per kind and size, closed
once at the end; without a session each call gets its own."""
from __future__ import annotations

import pytest

from data_prep.executors import base, choose

pytestmark = pytest.mark.unit


def test_a_session_shares_one_executor_per_kind_and_closes_each_once(monkeypatch):
    closed = []
    monkeypatch.setattr(base.Executor, "close", lambda self: closed.append(self))
    with choose.session():
        a, b, c = choose.make_executor("local", 2), choose.make_executor("local", 2), choose.make_executor("local", 1)
        with choose.session():  # nested: the outer one owns them
            assert choose.make_executor("local", 2) is a
        assert not closed
    assert a is b and c is not a
    assert sorted(map(id, closed)) == sorted(map(id, (a, c)))
    assert choose.make_executor("local", 2) is not choose.make_executor("local", 2)  # no session: one each


def test_a_session_closes_its_executors_when_the_command_fails(monkeypatch):
    closed = []
    monkeypatch.setattr(base.Executor, "close", lambda self: closed.append(self))
    with pytest.raises(RuntimeError, match="a pass failed"):
        with choose.session():
            choose.make_executor("local", 1)
            raise RuntimeError("a pass failed")
    assert len(closed) == 1 and choose._SHARED is None

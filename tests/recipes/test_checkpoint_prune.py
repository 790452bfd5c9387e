"""Pruning at each completed save: keep_last complete tags, and no interrupted save left behind for ever."""
from __future__ import annotations

import pytest

from recipes.checkpoint.format.tags import MARKER, mark_complete, tag_for


def _tag(root, step: int, complete: bool) -> None:
    d = root / tag_for(step)
    d.mkdir()
    (d / "mp_rank_00_model_states.pt").write_bytes(b"x" * 100)
    if complete:
        (d / MARKER).write_text("{}")


@pytest.mark.unit
def test_completing_a_save_removes_older_interrupted_ones_only(tmp_path):
    _tag(tmp_path, 2, complete=True)
    _tag(tmp_path, 4, complete=False)  # an async save interrupted (killed run), full size, never loaded
    _tag(tmp_path, 6, complete=True)
    _tag(tmp_path, 8, complete=False)  # the save just completed: its files are durable, the marker comes now
    _tag(tmp_path, 10, complete=False)  # newer than the completed one (a resume from an older tag re-saves it)
    mark_complete(tmp_path, tag_for(8), 8, {"step": 8}, keep_last=2)
    left = sorted(int(p.name.removeprefix("global_step")) for p in tmp_path.glob("global_step*"))
    assert left == [6, 8, 10]
    assert (tmp_path / tag_for(8) / MARKER).is_file() and not (tmp_path / tag_for(10) / MARKER).exists()
    assert (tmp_path / "latest").read_text() == tag_for(8)

"""`python -m recipes bench save-stall` on a tiny model: the figures it prints have the right structure (the timings
themselves are a benchmark, not a test)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.runs import recipes_cli

pytestmark = pytest.mark.multiproc

TINY = ["model.hidden_size=64", "model.ffn_hidden_size=128", "model.num_attention_heads=4",
        "model.num_query_groups=2", "model.vocab_size=512"]


def _check(s: dict, placements: tuple[str, ...], ranks: int) -> None:
    assert s["ranks"] == ranks and 100_000 < s["params"] < 1_000_000 and s["checkpoint_bytes_per_rank"] > 0
    assert tuple(s["placements"]) == placements
    for r in s["placements"].values():
        for mode in ("sync", "async"):
            m = r[mode]
            assert len(m["stalls_s"]) == 2 and m["blocked_in_save_s"] > 0 and m["finish_wait_s"] >= 0
        assert r["async_over_sync"] == pytest.approx(r["async"]["stall_s"] / r["sync"]["stall_s"])
        assert r["async_over_sync_blocked"] == pytest.approx(r["async"]["blocked_in_save_s"]
                                                             / r["sync"]["blocked_in_save_s"])


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return recipes_cli(["bench", "save-stall", "--saves", "2", "--dir", str(tmp_path), *args, *TINY], timeout=300)


def test_measure_save_stall_reports_sync_and_async_per_save(tmp_path):
    out = _run(tmp_path, "--ranks", "2", "--placement", "unpinned", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    _check(json.loads(out.stdout), ("unpinned",), 2)
    assert list(tmp_path.iterdir()) == []  # its temporary checkpoints are gone


def test_measure_save_stall_pinned_and_unpinned(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        out = _run(tmp_path, "--ranks", "1", "--placement", "pinned")
        assert out.returncode != 0 and "needs 2 cores per rank" in out.stderr, out.stderr[-2000:]
        return
    out = _run(tmp_path, "--ranks", "1", "--json")  # default: both
    assert out.returncode == 0, out.stderr[-3000:]
    _check(json.loads(out.stdout), ("pinned", "unpinned"), 1)
    assert list(tmp_path.iterdir()) == []
    out = _run(tmp_path, "--ranks", str(len(os.sched_getaffinity(0))), "--placement", "pinned")
    assert out.returncode != 0 and "needs 2 cores per rank" in out.stderr, out.stderr[-2000:]


def test_a_missing_dir_is_one_line_before_any_rank_starts(tmp_path, capsys):
    from recipes.tools.measure_save_stall import main

    with pytest.raises(SystemExit) as e:
        main(["--dir", str(tmp_path / "missing"), "--ranks", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--dir {tmp_path / 'missing'}: no such directory" in err and "Traceback" not in err

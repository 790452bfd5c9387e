"""`python -m recipes measure-save-stall` on a tiny model: the figures it prints have the right structure (the timings
themselves are a benchmark, not a test)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.runs import REPO, worker_env

pytestmark = pytest.mark.multiproc

TINY = ["model.hidden_size=64", "model.ffn_hidden_size=128", "model.num_attention_heads=4",
        "model.num_query_groups=2", "model.vocab_size=512"]


def test_measure_save_stall_reports_sync_and_async_per_save(tmp_path):
    out = subprocess.run([sys.executable, "-m", "recipes", "measure-save-stall", "--ranks", "2", "--saves", "2",
                          "--dir", str(tmp_path), "--json", *TINY], cwd=REPO, env=worker_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout)
    assert s["ranks"] == 2 and 100_000 < s["params"] < 1_000_000 and s["checkpoint_bytes_per_rank"] > 0
    for mode in ("sync", "async"):
        m = s[mode]
        assert len(m["stalls_s"]) == 2 and m["blocked_in_save_s"] > 0 and m["finish_wait_s"] >= 0
    assert s["async_over_sync"] == pytest.approx(s["async"]["stall_s"] / s["sync"]["stall_s"])
    assert list(tmp_path.iterdir()) == []  # its temporary checkpoints are gone

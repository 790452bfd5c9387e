"""recipes.train.local_ranks without training: a forked rank gets exactly its environment, a launcher's Python signal
handler is not inherited, and exit codes, exceptions and signals come back through ForkedRank as subprocess.Popen
reports them. Run in a short subprocess of its own (forking pytest itself, with its threads, would be unsafe)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.runs import REPO

pytestmark = pytest.mark.unit

SCRIPT = r"""
import os, signal, sys, time
from recipes.train.local_ranks import fork_rank

signal.signal(signal.SIGTERM, lambda *a: None)  # the launcher's forwarder: must not survive into a rank

def worker(argv):
    what = argv[0]
    if what == "env":
        return 0 if dict(os.environ) == {"RANK": "7", "ONLY": "this"} else 5
    if what == "code":
        return 3
    if what == "exit":
        sys.exit(2)
    if what == "raise":
        raise RuntimeError("boom")
    time.sleep(60)  # "sleep": waits for a signal
    return 0

ranks = {w: fork_rank({"RANK": "7", "ONLY": "this"}, [w], worker) for w in ("env", "code", "exit", "raise", "sleep")}
ranks["sleep"].send_signal(signal.SIGTERM)
print({w: r.wait() for w, r in ranks.items()})
ranks["code"].send_signal(signal.SIGTERM)  # already reaped: a no-op, not an error
print("after", ranks["code"].poll())
"""


def test_forked_ranks_report_like_popen():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["{'env': 0, 'code': 3, 'exit': 2, 'raise': 1, 'sleep': -15}", "after 3"], \
        out.stdout + out.stderr
    assert "rank 7: start failed" in out.stderr and "RuntimeError: boom" in out.stderr

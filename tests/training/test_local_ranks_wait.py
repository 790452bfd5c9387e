"""`recipes train --local`'s wait on its ranks (recipes.train.local_ranks.wait_for_ranks), on real processes: when a
rank fails, a rank that fails a moment later still prints why before the rest are killed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recipes.train.local_ranks import wait_for_ranks

pytestmark = pytest.mark.unit


def _rank(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import sys, time\n{code}"], stdout=subprocess.PIPE, text=True)


def test_a_rank_failing_second_still_says_why():
    """Rank 0 exits first with a generic error, as the ranks that only saw a collective fail do; rank 1, the cause,
    prints its reason 0.5 s later. The launcher returns rank 0's code, and rank 1's reason is printed."""
    procs = [_rank("sys.exit(3)"), _rank("time.sleep(0.5); print('disk full on rank 1', flush=True); sys.exit(4)")]
    assert wait_for_ranks(procs, grace_s=20.0) == 3  # a generous grace: it ends when rank 1 does
    assert "disk full on rank 1" in procs[1].stdout.read()
    assert procs[1].returncode == 4
    for p in procs:
        p.stdout.close()


def test_a_rank_that_hangs_is_killed_after_the_grace():
    procs = [_rank("sys.exit(2)"), _rank("time.sleep(60)")]
    assert wait_for_ranks(procs, grace_s=0.5) == 2
    assert procs[1].returncode == -9  # SIGKILL
    for p in procs:
        p.stdout.close()


def test_all_ranks_succeeding_return_zero():
    procs = [_rank("sys.exit(0)"), _rank("time.sleep(0.3)")]
    assert wait_for_ranks(procs, grace_s=5.0) == 0
    for p in procs:
        p.stdout.close()


def test_a_tqdm_bar_before_the_ranks_does_not_keep_them_from_being_forked():
    """tqdm's monitor thread (started by a progress bar, e.g. transformers' loading bars in import-hf) made fork
    unsafe, so the ranks ran as fresh interpreters; prepare_template stops it first."""
    code = ("from tqdm.auto import tqdm\n"  # a subclass of tqdm's own, as transformers' bars are
            "for _ in tqdm(range(3), mininterval=0): pass\n"
            "from recipes.train import local_ranks\n"
            "before = local_ranks.thread_count()\n"
            "local_ranks.stop_tqdm_monitor()\n"
            "print(before, local_ranks.thread_count(), local_ranks.fork_problem())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert r.stdout.split() == ["2", "1", "None"], r.stderr[-2000:]

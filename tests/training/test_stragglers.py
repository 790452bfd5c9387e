"""The straggler report names the slow rank (recipes/train/stragglers.py). One rank of a TP=2 x PP=2 run is made slow
(RECIPES_TEST_FAULT="slow ...": a sleep in every forward pass of its model); its peers wait for it inside the TP
all-reduces and the pipeline's send/recv, so every rank's wall time per step is as long as the slow one's, but the
time outside the collectives names it, exactly. The helpers' arithmetic is checked by hand in one process."""
from __future__ import annotations

import subprocess

import pytest

from recipes.train.collectives import decode_text, encode_text
from tests.support.runs import REPO, on_corpus, pretrain_cmd, train_records, worker_env

SLOW_RANK, SLEEP = 3, 0.25  # rank 3 = TP rank 1 of pipeline stage 1 (rank order tp-dp-pp)


@pytest.mark.unit
def test_slowest_rank_is_measured_against_its_own_pipeline_stage():
    from recipes.train.stragglers import slowest_rank

    stages = [0, 0, 0, 0, 1, 1, 1, 1]
    # the last stage computes the loss: all its ranks are slower than stage 0's, none of them is a straggler
    rank, excess = slowest_rank([1.0, 1.0, 1.02, 1.0, 2.0, 2.0, 2.1, 2.0], stages)
    assert rank == 6 and excess == pytest.approx(0.05)
    rank, excess = slowest_rank([1.0, 1.5, 1.0, 1.0, 2.0, 2.0, 2.1, 2.0], stages)
    assert rank == 1 and excess == pytest.approx(0.5)


@pytest.mark.unit
def test_host_names_travel_as_fixed_size_bytes():
    for text in ("node-17.cluster.example", "ünïcode-host", ""):
        t = encode_text(text)
        assert t.shape == (256,) and decode_text(t) == text
    assert decode_text(encode_text("x" * 300)) == "x" * 256  # cut, never an error


@pytest.mark.unit
def test_comm_clock_counts_blocked_time_in_its_window_only():
    """A fake clock that only the wrapped calls advance: a blocking call 1 s, an async call's wait 10 s, a call made
    inside another 100 s (it must not count twice), calls outside the window or from another thread 1000 s."""
    import threading

    import torch

    from recipes.train.stragglers import CommClock

    now = [0.0]
    clock = CommClock(now=lambda: now[0])

    def advance(seconds):
        now[0] += seconds

    class Work:
        def wait(self):
            advance(10)

    blocking = clock._wrap(lambda: advance(1))
    issuing = clock._wrap(lambda: Work())  # an async call: issued at once, waited for later
    outer = clock._wrap(lambda: (advance(100), blocking()))
    outside = clock._wrap(lambda: advance(1000))
    outside()  # no window open
    clock.start(torch.device("cpu"))
    blocking()
    issuing().wait()
    outer()
    other = threading.Thread(target=outside)
    other.start()
    other.join()
    assert clock.stop() == 1 + 10 + 101
    outside()
    clock.start(torch.device("cpu"))
    assert clock.stop() == 0


@pytest.mark.unit
def test_comm_clock_wraps_every_call_of_torch_distributed_that_waits_for_peers():
    """Every public collective and point-to-point function of torch.distributed (found by name; the object helpers,
    which call the tensor ones, aside) is one the clock wraps. torch 2.13 added all_gather_single and
    reduce_scatter_single, which context parallelism's K/V gather calls: the clock missed them until this test."""
    import re

    import torch

    from recipes.train.stragglers import _CALLS

    kinds = re.compile(r"(all_gather|all_reduce|reduce_scatter|all_to_all|broadcast|barrier|send|recv|^gather|"
                       r"^scatter|^reduce)")
    public = [n for n in dir(torch.distributed) if kinds.search(n) and callable(getattr(torch.distributed, n))
              and not n.startswith("_") and not n[0].isupper() and not n.endswith(("_object", "_object_list"))
              and n != "reduce_op"]
    assert "all_gather_single" in public and "all_reduce" in public  # the pattern finds them
    assert sorted(set(public) - set(_CALLS)) == []


@pytest.mark.multiproc
def test_the_slowed_rank_is_named(corpus, tmp_path):
    env = dict(worker_env(), RECIPES_TEST_FAULT=f"slow rank={SLOW_RANK} step=1 seconds={SLEEP}")
    cmd = pretrain_cmd(4, *on_corpus(tmp_path, corpus), "parallel.tp=2", "parallel.pp=2", "training.train_steps=4",
                       "training.log_interval=1", "checkpoint.save_interval=100")
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-4000:]
    records = train_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    micro_batches = 8  # global batch 8, micro-batch 1, DP 1
    for r in records:
        assert r["slowest_rank"] == SLOW_RANK, r
        # its compute time holds its sleeps; the median rank's does not
        assert r["compute_time_max_s"] >= micro_batches * SLEEP > r["compute_time_p50_s"], r
        # ...while rank 0 (not slowed) took as long per step in wall time: it waited for rank 3 in the collectives
        assert r["step_time_s"] >= micro_batches * SLEEP, r
    named = f"straggler: rank {SLOW_RANK} on host"  # after 3 log intervals in a row (recipes.train.stragglers)
    assert named in out.stderr, out.stderr[-4000:]
    assert out.stderr.count("straggler: rank ") == out.stderr.count(named)  # nobody else is named

"""The pieces of unattended runs, in process: which ranks the hang watchdog names, the heartbeat file a rank keeps,
the test-only fault spec, the restart record, the recipe's supervision facts, and the options train.sh refuses."""
from __future__ import annotations

import json
import time

import pytest

from launch import supervise, watchdog
from recipes.train.faults import Fault
from recipes.train.heartbeat import WRITE_INTERVAL_S, Heartbeat
from tests.support.launch import TOY, run_launch

pytestmark = pytest.mark.unit


def beat(rank, step, phase, host="n1"):
    return {"rank": rank, "host": host, "pid": 100 + rank, "step": step, "phase": phase}


def test_behind_is_the_lowest_step_then_the_earliest_phase():
    beats = {0: beat(0, 7, "forward-backward"), 1: beat(1, 6, "save", "n2"), 2: beat(2, 6, "data", "n2"),
             3: beat(3, 7, "sync")}
    v = watchdog.verdict(beats, 4, 30)
    assert v["behind"] == [2] and v["culprit_host"] == "n2"
    assert "  behind: rank 2 on host n2 (step 6, phase data)" in v["report"]


def test_every_rank_stuck_alike_blames_no_host_and_missing_ranks_come_first():
    same = {r: beat(r, 3, "forward-backward", f"n{r}") for r in range(2)}
    v = watchdog.verdict(same, 2, 10)
    assert v["behind"] == [0, 1] and v["culprit_host"] is None and "stack dumps show which" in v["why"]
    ranks, why = watchdog.behind({0: beat(0, 3, "data")}, 3)
    assert ranks == [1, 2] and "never wrote a heartbeat" in why


def test_watch_reports_a_hang_only_after_the_timeout_without_progress(tmp_path):
    hb = tmp_path / "hb"
    hb.mkdir()
    (hb / "rank-0.json").write_text(json.dumps(beat(0, 1, "data")))
    (hb / "rank-1.json").write_text(json.dumps(beat(1, 1, "forward-backward")))
    w = watchdog.HangWatch(2, 0.6)  # fed the heartbeats and the launcher's clock
    t0 = 1000.0
    assert w.observe(watchdog.read_heartbeats(hb), t0) is None
    assert w.observe(watchdog.read_heartbeats(hb), t0 + 0.59) is None  # not before the timeout
    v = w.observe(watchdog.read_heartbeats(hb), t0 + 0.61)
    assert v is not None and v["behind"] == [0]
    # Start-up alone never counts as a hang (the distributed time-outs cover it).
    for r in (0, 1):
        (hb / f"rank-{r}.json").write_text(json.dumps(beat(r, 0, "resume")))
    w = watchdog.HangWatch(2, 0.3)
    assert all(w.observe(watchdog.read_heartbeats(hb), t0 + k * 0.05) is None for k in range(31))


def test_heartbeat_file_is_replaced_whole_and_ends_at_the_newest_step(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LAUNCH_HOST", "nodeX")
    hb = Heartbeat(tmp_path)
    for step in range(1000):  # a fast loop: beats cost an assignment, the thread writes
        hb.beat(step, "data")
        hb.beat(step, "forward-backward")
    hb.beat(1000, "log", 0.25)
    deadline = time.monotonic() + 20 * WRITE_INTERVAL_S  # the writer thread catches up within an interval or two
    while _step_written(tmp_path / "rank-3.json") != 1000 and time.monotonic() < deadline:
        time.sleep(0.02)
    rec = json.loads((tmp_path / "rank-3.json").read_text())
    assert (rec["rank"], rec["host"], rec["step"], rec["phase"], rec["step_time_s"]) == (3, "nodeX", 1000, "log", 0.25)
    assert [p.name for p in tmp_path.iterdir()] == ["rank-3.json"]  # no temporary file left behind
    Heartbeat(None).beat(1, "data")  # no launcher: nothing to write, no error


def test_phase_changes_are_written_at_most_every_interval_and_only_when_changed(tmp_path, monkeypatch):
    """Within a step the phase changes thousands of times (a fast loop): the writer thread replaces the file at most
    once per interval (it sleeps a whole interval between writes), and once the last change is written it writes
    nothing more. Each replacement is seen where it happens (os.replace onto the heartbeat file). The interval is
    shortened to 0.1 s for the test; the rule does not depend on its value."""
    import os

    from recipes.train import heartbeat

    interval = 0.1
    monkeypatch.setattr(heartbeat, "WRITE_INTERVAL_S", interval)
    monkeypatch.setenv("RANK", "0")
    path = tmp_path / "rank-0.json"
    writes, replace = [], os.replace

    def recorded(src, dst, *args, **kwargs):
        if str(dst) == str(path):
            writes.append(time.monotonic())  # counted before it shows: a reader that sees it finds it counted
        replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", recorded)
    hb = Heartbeat(tmp_path)
    hb.beat(1, "data")  # a new step: written at once, by this thread
    assert len(writes) == 2  # the start record and step 1
    start, changes = time.monotonic(), 0
    while time.monotonic() - start < 6 * interval:
        for phase in ("data", "forward-backward", "log"):
            hb.beat(1, phase)
            changes += 1
    hb.beat(1, "sync")  # the last change, a phase the loop never set
    deadline = time.monotonic() + 60
    while _phase_written(path) != "sync" and time.monotonic() < deadline:  # it reaches the file
        time.sleep(interval / 4)
    assert _phase_written(path) == "sync"
    settled = len(writes)
    time.sleep(5 * interval)  # nothing changes now: nothing is written
    phase_writes = writes[2:]
    gaps = [b - a for a, b in zip(phase_writes, phase_writes[1:])]
    assert changes > 1000 and len(phase_writes) >= 2, (changes, phase_writes)  # the thread does write changes
    assert min(gaps) >= interval * 0.95, gaps  # never two writes within an interval
    assert len(writes) == settled, writes[settled - 1:]


def _phase_written(path):
    try:
        return json.loads(path.read_text())["phase"]
    except (OSError, ValueError):
        return None


def _step_written(path):
    try:
        return json.loads(path.read_text())["step"]
    except (OSError, ValueError):  # not written yet (the file is replaced whole, never seen half-written)
        return None


def test_fault_spec_is_strict_and_targets_one_rank_step_host_and_attempt(monkeypatch):
    monkeypatch.setenv("RECIPES_TEST_FAULT", "kill rank=2 step=5 host=node2 attempt=1")
    f = Fault.from_env()
    assert (f.kind, f.rank, f.step, f.host, f.attempt) == ("kill", 2, 5, "node2", "1")
    monkeypatch.setenv("LAUNCH_HOST", "node1")
    f.maybe_fire(2, 5)  # another host: nothing happens (a kill would end this test process)
    for bad in ("explode rank=1 step=2", "hang rank=1", "hang rank=1 step=2 stray"):
        monkeypatch.setenv("RECIPES_TEST_FAULT", bad)
        with pytest.raises(ValueError, match="RECIPES_TEST_FAULT"):
            Fault.from_env()
    monkeypatch.delenv("RECIPES_TEST_FAULT")
    assert Fault.from_env() is None


def test_restart_record_keeps_numbers_and_nulls(tmp_path):
    failure = supervise.Failure("exit code 137", 137, 1, "node2")
    rec = json.loads(json.dumps(supervise.restart_record(1, 2, failure, resumed=4, last=None, backoff_s=0.5,
                                                         failed_at=1.5, replaced=None, hosts=["node1", "node2"])))
    assert {k: rec[k] for k in ("restart", "why", "exit_code", "steps_lost", "backoff_s", "replaced", "hosts")} == {
        "restart": 1, "why": "exit code 137", "exit_code": 137, "steps_lost": None, "backoff_s": 0.5,
        "replaced": None, "hosts": "node1 node2"}


def test_supervision_facts_and_refusals(tmp_path):
    r = run_launch("train.sh", TOY, "--hostfile", _hostfile(tmp_path), "--backend", "slurm", "--max-restarts", 2,
                   "--dry-run", "--log-dir", tmp_path / "s")
    assert r.returncode == 2 and "under Slurm the job requeues itself" in r.stderr, r.stderr
    r = run_launch("train.sh", TOY, "--backend", "local", "--num-gpus", 2, "--spares", 1, "--dry-run")
    assert r.returncode == 2 and "--spares needs hosts to swap in" in r.stderr, r.stderr
    r = run_launch("train.sh", TOY, "--hostfile", _hostfile(tmp_path), "--backend", "torchrun-ssh", "--spares", 2,
                   "--dry-run", "--master-port", 23456)
    assert r.returncode == 2 and "--spares 2 leaves no host to train on" in r.stderr, r.stderr
    # One spare of two hosts: the world is the first host only (2 ranks), the plan never names the spare.
    r = run_launch("train.sh", TOY, "--hostfile", _hostfile(tmp_path), "--backend", "torchrun-ssh", "--spares", 1,
                   "--dry-run", "--master-port", 23456, "--log-dir", tmp_path / "d")
    assert r.returncode == 0, r.stderr
    assert "world_size=2" in r.stdout and "gpuB" not in r.stdout
    r = run_launch("train.sh", TOY, "--max-restarts", "many", "--dry-run")
    assert r.returncode == 2 and "--max-restarts 'many'" in r.stderr


def _hostfile(tmp_path):
    p = tmp_path / "hostfile"
    p.write_text("gpuA slots=2\ngpuB slots=2\n")
    return p

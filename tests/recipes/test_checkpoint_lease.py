"""Two runs taking one checkpoint directory's lease at the same moment: exactly one gets it (an atomic exclusive
create, recipes/checkpoint/lease.py), the other is refused naming the holder. The moment is made wide on purpose:
every read of the lease file returns what it read 0.3 s late, so both runs have looked before either writes (a
check-then-write lease gives it to both)."""
from __future__ import annotations

import json
import threading
import time

import pytest

from recipes.checkpoint import lease as run_lease

pytestmark = pytest.mark.unit


@pytest.fixture
def slow_reads(monkeypatch):
    real_read = run_lease.read

    def slow_read(ckpt_dir):
        found = real_read(ckpt_dir)
        time.sleep(0.3)
        return found

    monkeypatch.setattr(run_lease, "read", slow_read)


def _race(tmp_path, names=("run-a", "run-b")) -> tuple[list, list]:
    won, refused = [], []

    def take(name):
        try:
            won.append(run_lease.Lease(tmp_path, name).acquire())
        except run_lease.LeaseError as e:
            refused.append((name, str(e)))

    threads = [threading.Thread(target=take, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return won, refused


def test_two_runs_starting_together_get_one_lease(tmp_path, slow_reads):
    won, refused = _race(tmp_path)
    try:
        assert len(won) == 1 and len(refused) == 1, (won, refused)
        holder = json.loads((tmp_path / run_lease.LEASE).read_text())["run_id"]
        assert holder == won[0].me
        assert f"run {holder} " in refused[0][1] and "run.lease" in refused[0][1]
    finally:
        for lease in won:
            lease.release()
    assert not (tmp_path / run_lease.LEASE).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary or moved-aside files left


def test_two_runs_taking_over_a_dead_runs_lease_together_get_one(tmp_path, slow_reads):
    stale = {"run_id": "old", "host": "elsewhere", "pid": 1, "heartbeat": time.time() - run_lease.STALE_S - 1}
    (tmp_path / run_lease.LEASE).write_text(json.dumps(stale))
    won, refused = _race(tmp_path)
    try:
        assert len(won) == 1 and len(refused) == 1, (won, refused)
        assert json.loads((tmp_path / run_lease.LEASE).read_text())["run_id"] == won[0].me
    finally:
        for lease in won:
            lease.release()

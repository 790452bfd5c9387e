"""One run per checkpoint directory: a lease file `checkpoint.dir/run.lease` (run id, host, pid, heartbeat).

Two runs saving into one directory interleave their checkpoints: an orphaned run still training while its relaunch
starts, or two people pointing at the same path. Global rank 0 takes the lease before anything is written there and
renews its heartbeat every HEARTBEAT_S seconds from a daemon thread; another run is refused while the heartbeat is
fresh. A lease whose heartbeat is older than STALE_S (its run died without releasing it), or whose process is gone
from this very host, is taken over. The launchers (`recipes.train.cli --local`, launch/train.sh) check it before
they start any process:
    python -m recipes.checkpoint.store.lease check RECIPE [section.key=value ...]
On success `check` prints `stop_grace_seconds=N` (the recipe's checkpoint.stop_grace_seconds): launch/train.sh keeps
it in the run directory for launch/stop.sh, so a stop waits for the ranks' pre-emption save.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

LEASE = "run.lease"
HEARTBEAT_S = float(os.environ.get("RECIPES_LEASE_HEARTBEAT_S", 15))
STALE_S = float(os.environ.get("RECIPES_LEASE_STALE_S", 120))


class LeaseError(RuntimeError):
    """The checkpoint directory belongs to another live run."""


def run_id() -> str:
    """This run's id: the launcher's (train.sh / recipes train --local), else one made for this process."""
    return (os.environ.get("LAUNCH_RUN_ID") or os.environ.get("RECIPES_RUN_ID")
            or f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}")


def read(ckpt_dir: str | Path) -> dict | None:
    try:
        return json.loads((Path(ckpt_dir) / LEASE).read_text())
    except (OSError, ValueError):  # none, or half-written by a crash: nobody can hold it
        return None


def _alive_here(lease: dict) -> bool:
    if lease.get("host") != socket.gethostname():
        return True  # another host: only the heartbeat can tell
    try:
        pid = int(lease["pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError):
        return True
    # A killed rank whose parent died too is a zombie until something reaps it (a container whose PID 1 does not):
    # it answers kill(pid, 0) but holds nothing.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def holder_problem(ckpt_dir: str | Path, me: str) -> str | None:
    """Why run `me` may not use ckpt_dir (None if it may)."""
    lease = read(ckpt_dir)
    if not lease or lease.get("run_id") == me:
        return None
    age = time.time() - float(lease.get("heartbeat", 0))
    if age > STALE_S or not _alive_here(lease):
        return None
    return (f"{Path(ckpt_dir) / LEASE}: run {lease.get('run_id')} (host {lease.get('host')}, pid {lease.get('pid')}) "
            f"is using this checkpoint directory (heartbeat {age:.0f} s ago); two runs saving into one directory "
            "interleave their checkpoints. Stop that run (launch/stop.sh RUN_DIR) or set another checkpoint.dir; if "
            f"that run is dead, its lease goes stale {max(0.0, STALE_S - age):.0f} s from now (or delete the file).")


class Lease:
    def __init__(self, ckpt_dir: str | Path, me: str | None = None):
        self.path = Path(ckpt_dir) / LEASE
        self.me = me or run_id()
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        body = {"run_id": self.me, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time()}
        tmp = self.path.with_name(f"{LEASE}.{self.me}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)

    def acquire(self) -> "Lease":
        problem = holder_problem(self.path.parent, self.me)
        if problem:
            raise LeaseError(problem)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._beat, name="run-lease", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            lease = read(self.path.parent)
            if lease and lease.get("run_id") != self.me:  # taken over (we looked dead): stop claiming it
                self.lost = f"{self.path}: run {lease.get('run_id')} took this checkpoint directory over"
                return
            try:
                self._write()
            except OSError:
                pass  # a full or flaky disk: the next beat retries; the save itself will report the problem

    def check(self) -> None:
        """Before each save: refuse to write into a directory another run has taken over."""
        if self.lost:
            raise LeaseError(f"{self.lost}; not saving into it")

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        lease = read(self.path.parent)
        if lease and lease.get("run_id") == self.me:
            self.path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] != "check":
        print("usage: python -m recipes.checkpoint.store.lease check RECIPE [section.key=value ...]", file=sys.stderr)
        return 2
    from recipes.config.loading import RecipeError, load_recipe

    try:
        recipe = load_recipe(argv[1], argv[2:])
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problem = recipe.checkpoint.dir and holder_problem(recipe.checkpoint.dir, run_id())
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 5
    print(f"stop_grace_seconds={recipe.checkpoint.stop_grace_seconds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

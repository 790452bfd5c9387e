"""One run per checkpoint directory: a lease file `checkpoint.dir/run.lease` (run id, host, pid, heartbeat).

Two runs saving into one directory interleave their checkpoints: an orphaned run still training while its relaunch
starts, or two people pointing at the same path. Global rank 0 takes the lease before anything is written there and
renews its heartbeat every HEARTBEAT_S seconds from a daemon thread; another run is refused while the heartbeat is
fresh. A lease whose heartbeat is older than STALE_S (its run died without releasing it), or whose process is gone
from this very host, is taken over.

Taking it is atomic, so that of two runs starting together exactly one gets it: the lease is written in full under a
unique temporary name and hard-linked to `run.lease`, which fails if the name exists (an exclusive create that never
shows a half-written lease, and works on NFS). A stale lease is first renamed aside under a unique name; only the
run whose rename moved that very lease goes on (a run that moved a fresh lease instead puts it back).

The launchers (`recipes.train.cli --local`, launch/train.sh) check it before they start any process:
    python -m recipes.checkpoint.lease check RECIPE [section.key=value ...]
On success `check` prints `stop_grace_seconds=N` (the recipe's checkpoint.stop_grace_seconds): launch/train.sh keeps
it in the run directory for launch/stop.sh, so a stop waits for the ranks' pre-emption save.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from data_prep import file_modes as file_mode

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
    return read_file(Path(ckpt_dir) / LEASE)


def read_file(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # none (leases are written whole: see Lease._create)
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

    def _body(self) -> str:
        return json.dumps({"run_id": self.me, "host": socket.gethostname(), "pid": os.getpid(),
                           "heartbeat": time.time()})

    def _temporary(self) -> str:
        """The lease's content in full, in a new file with a unique name (created exclusively, no symlink followed)."""
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{LEASE}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            # readable by the other users' launchers that check it (0644), or as checkpoint.file_mode says
            os.fchmod(f.fileno(), file_mode.data_mode())
            f.write(self._body())
        return tmp

    def _write(self) -> None:
        """Renew our lease (replace it whole)."""
        os.replace(self._temporary(), self.path)

    def _create(self) -> bool:
        """Atomic exclusive create: True if the lease was free and is ours now."""
        tmp = self._temporary()
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def _move_aside(self, judged: dict | None) -> None:
        """Remove the stale lease `judged` (as read) unless another run replaced it meanwhile."""
        aside = self.path.with_name(f".{LEASE}.stale.{self.me}.{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another run moved it first
        moved = read_file(aside)
        if judged is not None and moved != judged:  # a fresh lease, created after we read: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)

    def acquire(self) -> "Lease":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            if self._create():
                break
            current = read(self.path.parent)
            if current and current.get("run_id") == self.me:  # ours already (a rank of this run restarted)
                self._write()
                break
            problem = holder_problem(self.path.parent, self.me)
            if problem:
                raise LeaseError(problem)
            self._move_aside(current)
        else:
            raise LeaseError(f"{self.path}: other runs are taking this checkpoint directory at the same time; "
                             "start one run per checkpoint.dir")
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
        print("usage: python -m recipes.checkpoint.lease check RECIPE [section.key=value ...]", file=sys.stderr)
        return 2
    from recipes.config.cli_help import refuse
    from recipes.config.loading import RecipeError, load_recipe

    try:
        recipe = load_recipe(argv[1], argv[2:])
    except (RecipeError, ValueError) as e:
        return refuse(e)
    problem = recipe.checkpoint.dir and holder_problem(recipe.checkpoint.dir, run_id())
    if problem:
        refuse(problem)
        return 5  # held by another run: the launcher's own code for it
    print(f"stop_grace_seconds={recipe.checkpoint.stop_grace_seconds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The rank's side of launch/train.sh's hang watchdog: a heartbeat file per rank, and a stack dump on SIGUSR2.

The launcher names two directories in the environment (per attempt, under its log dir; remote nodes must see the
same path, i.e. the log dir is on a shared file system): LAUNCH_HEARTBEAT_DIR, where each rank keeps
`rank-<R>.json` = {rank, host, pid, step, phase, since, time, step_time_s} (replaced atomically, so a reader never
sees half a file), and LAUNCH_STACKS_DIR, where faulthandler writes every thread's Python stack to `rank-<R>.txt`
when the launcher sends SIGUSR2. Without those variables (a plain `--local` run, a test) both are no-ops.

Both files are created under fresh unpredictable names (exclusively, mode 0600: never through a file or link someone
planted in a shared directory) and renamed into place.

`beat(step, phase)` stores two values; a new step is written at once (one tiny file per step, so the launcher's "last
step reached" after a crash is exact), phase changes within a step by a daemon thread at most WRITE_INTERVAL_S apart
and only when something changed, so a fast loop does not hammer a shared file system.
The thread keeps writing while the main thread is blocked in a collective or a sleep, so the file shows where the
rank is stuck.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

WRITE_INTERVAL_S = 0.5
STACK_SIGNAL = signal.SIGUSR2  # SIGTERM/SIGUSR1 are the pre-emption signals (recipes.train.signals)


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))


def install_stack_dump() -> Path | None:
    """At rank start: SIGUSR2 writes every thread's stack to $LAUNCH_STACKS_DIR/rank-<R>.txt (faulthandler works
    inside a stuck collective or a GIL-holding loop, where a Python-level handler would never run)."""
    d = os.environ.get("LAUNCH_STACKS_DIR")
    if not d:
        return None
    path = Path(d) / f"rank-{_rank()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    f = os.fdopen(fd, "a")  # kept open for the life of the process: faulthandler writes to its file descriptor
    f.write(f"# rank {_rank()} host {os.environ.get('LAUNCH_HOST', socket.gethostname())} pid {os.getpid()}\n")
    f.flush()
    os.replace(tmp, path)  # the open descriptor follows the file to its name
    faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)
    return path


class Heartbeat:
    """Progress of this rank for the launcher's watchdog; `beat` is cheap, a daemon thread writes."""

    def __init__(self, directory: str | os.PathLike | None):
        self.path = Path(directory) / f"rank-{_rank()}.json" if directory else None
        self._state = (0, "start", time.time(), None)  # step, phase, since, last step time: one tuple, swapped whole
        self._written = None
        self._lock = threading.Lock()  # the thread and a step's own write share the temporary file
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fixed = {"rank": _rank(), "host": os.environ.get("LAUNCH_HOST", socket.gethostname()),
                       "pid": os.getpid()}
        self._write()
        threading.Thread(target=self._run, name="heartbeat", daemon=True).start()

    @classmethod
    def from_env(cls) -> "Heartbeat":
        return cls(os.environ.get("LAUNCH_HEARTBEAT_DIR"))

    def beat(self, step: int, phase: str, step_time_s: float | None = None) -> None:
        if self.path is not None:
            last = step_time_s if step_time_s is not None else self._state[3]
            if (step, phase) != self._state[:2]:
                new_step = step != self._state[0]
                self._state = (step, phase, time.time(), last)
                if new_step:
                    self._write()

    def _write(self) -> None:
        with self._lock:
            state = self._state
            if state == self._written:
                return
            step, phase, since, step_time = state
            record = dict(self._fixed, step=step, phase=phase, since=since, time=time.time(), step_time_s=step_time)
            tmp = None
            try:
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(record))
                os.replace(tmp, self.path)  # atomic: the launcher reads either the old or the new file
            except OSError:
                if tmp:
                    Path(tmp).unlink(missing_ok=True)
                return  # a full or vanished log dir must not stop training; the watchdog then sees no progress
            self._written = state

    def _run(self) -> None:
        while True:
            time.sleep(WRITE_INTERVAL_S)
            self._write()

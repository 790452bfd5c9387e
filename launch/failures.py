"""Which rank failed, from per-rank exit records, never from what ranks print.

rank_exec.sh (around every rank) writes one line when its command ends, into the attempt's exit directory
(LAUNCH_EXIT_DIR), under a fresh name renamed to `rank-R.exit`:
    rank=R exit=CODE stopped=0|1 at=EPOCH host=HOST
`stopped=1`: the rank was signalled by us (a stop, a peer's failure); exit 143 is a SIGTERM from torchrun or Slurm
stopping it. The first record in time of a rank that died on its own is the failure (or a rank killed or crashed
within KILLED_WINDOW_S of it: `first_failure`). A rank printing a line that
looks like a record (or like the old `LAUNCH-FAIL rank=` line) changes nothing: its output is only ever copied."""
from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from launch import run_files
from launch.hostfile import valid_host

_RECORD = re.compile(r"^rank=(\d+) exit=(\d+) stopped=([01]) at=([0-9]+(?:\.[0-9]+)?) host=(\S*)$")


@dataclass(frozen=True)
class ExitRecord:
    rank: int
    exit_code: int
    stopped: bool
    at: float
    host: str | None          # as rank_exec.sh named it; None when it breaks the host rule

    @property
    def failed_on_its_own(self) -> bool:
        return self.exit_code not in (0, 128 + signal.SIGTERM) and not self.stopped

    def describe(self) -> str:
        why = f" (killed by signal {self.exit_code - 128})" if self.exit_code > 128 else ""
        return f"rank {self.rank} on host {self.host or '?'} exited with code {self.exit_code}{why}"


def parse_record(text: str) -> ExitRecord | None:
    m = _RECORD.match(text.strip())
    if not m:
        return None
    host = m[5] if valid_host(m[5]) else None
    return ExitRecord(int(m[1]), int(m[2]), m[3] == "1", float(m[4]), host)


# Killed or crashed by the system: SIGKILL (the OOM killer, a kill -9), SIGSEGV, SIGBUS, SIGILL, SIGFPE. Not SIGABRT,
# which a rank's runtime also raises on a peer's failure, nor SIGTERM (a stop).
_KILLED = {128 + s for s in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)}
KILLED_WINDOW_S = 5.0


def first_failure(records: list[ExitRecord]) -> ExitRecord | None:
    """The earliest rank that died on its own (the others were stopped because of it). A rank killed or crashed
    within KILLED_WINDOW_S of that earliest record is the failure instead: its peers exit with code 1 as soon as their
    collective breaks, and each record's time is when that rank's wrapper noticed, so on a loaded node a peer's record
    can come first."""
    failed = [r for r in records if r.failed_on_its_own]
    if not failed:
        return None
    first = min(failed, key=lambda r: (r.at, r.rank))
    killed = [r for r in failed if r.exit_code in _KILLED and r.at - first.at <= KILLED_WINDOW_S]
    return min(killed, key=lambda r: (r.at, r.rank)) if killed else first


class ExitWatch:
    """The exit records of one attempt, read as they appear: each file once (a directory listing per poll)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.records: dict[str, ExitRecord] = {}

    def poll(self) -> list[ExitRecord]:
        try:
            names = [e.name for e in os.scandir(self.dir) if e.name.endswith(".exit") and e.name.startswith("rank-")]
        except OSError:
            return list(self.records.values())
        for name in names:
            if name not in self.records:
                try:
                    rec = parse_record(run_files.read(self.dir / name, 4096))
                except (OSError, ValueError):  # vanished, or not a regular file of ours (a link, a FIFO, too big)
                    continue
                if rec is not None:
                    self.records[name] = rec
        return list(self.records.values())

    def first_failure(self) -> ExitRecord | None:
        return first_failure(self.poll())


def last_output(log: Path, host: str | None, rank: int, lines: int = 15, window: int = 1 << 18) -> list[str]:
    """The last lines `[host rank R] ...` of a node log, from its last `window` bytes (a log can be huge)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - window))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    tag = f"[{host} rank {rank}]"
    return [line for line in text.split("\n") if tag in line][-lines:]


def report(rec: ExitRecord, log_dir: Path, then: str) -> list[str]:
    """The lines that name the first failure and show its last output."""
    log = log_dir / f"{rec.host}.log"
    out = [f"FAILED: {rec.describe()} first;{then}", f"last output of rank {rec.rank} ({log}):"]
    return out + [f"    {line}" for line in last_output(log, rec.host, rec.rank)]


def main(argv: list[str]) -> int:
    """`python -m launch report-failure EXIT_DIR LOG_DIR TEXT` (the Slurm job script, after srun failed): 1 when no
    rank recorded a failure of its own."""
    exit_dir, log_dir, then = argv
    rec = ExitWatch(exit_dir).first_failure()
    if rec is None:
        return 1
    for line in report(rec, Path(log_dir), then):
        print(f"[launch] {line}", file=sys.stderr)
    return 0

"""The launcher's side of the hang watchdog: the ranks' heartbeat files (recipes/train/heartbeat.py), the hang
verdict, and where to send the stack-dump signal.

Every heartbeat field is checked before use (a record is text in a shared directory): rank, step and pid whole
numbers, phase a word, host a host name by the hostfile's rule; a record that breaks one is ignored. The launcher
only signals hosts of its own plan.

HangWatch is the decision, without processes or clocks of its own: fed the heartbeats and the time, it says when no
rank has changed step or phase for the timeout (on the launcher's clock: node clocks may differ). It arms itself when
the first rank reaches the training loop: an entry point that writes no heartbeat is never called hung, and start-up
is left to the distributed time-outs."""
from __future__ import annotations

import json
import re
from pathlib import Path

from launch import run_files
from launch.environment import write_private
from launch.hostfile import valid_host

# The loop's phases in the order a step goes through them (recipes/train/trainer.py, heartbeat phases): of the ranks at the lowest step,
# those in the earliest phase are behind (the others wait for them in a collective).
PHASES = ["start", "setup", "engine-setup", "resume", "data", "forward-backward", "log", "eval", "sync", "save",
          "done"]
# Start-up (imports, rendezvous, datasets, engine, checkpoint load) is not watched: its length varies with the
# machine's load and the checkpoint's size, and its collectives have their own limit (training.dist_timeout_minutes).
STARTUP = {"start", "setup", "engine-setup", "resume"}
_PHASE = re.compile(r"^[a-z][a-z-]{0,31}$")


def _valid(rec: object) -> bool:
    if not isinstance(rec, dict):
        return False
    ints = all(isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool) and rec[k] >= 0
               for k in ("rank", "step", "pid"))
    return ints and isinstance(rec.get("phase"), str) and bool(_PHASE.match(rec["phase"])) and valid_host(rec.get("host"))


def read_heartbeats(directory: str | Path) -> dict[int, dict]:
    out = {}
    for p in Path(directory).glob("rank-*.json"):
        try:
            rec = json.loads(run_files.read(p, 65536))
        except (OSError, ValueError):
            continue  # replaced atomically by the rank, so only a vanished or foreign file lands here
        if _valid(rec):
            out[rec["rank"]] = rec
    return out


def behind(beats: dict[int, dict], world: int) -> tuple[list[int], str]:
    """The ranks holding the job up, and why: missing ranks first, else the lowest step, then the earliest phase."""
    missing = [r for r in range(world) if r not in beats]
    if missing:
        return missing, "never wrote a heartbeat (stuck before the training loop started, or on a node whose log " \
                        "dir is not the launcher's: the heartbeat dir must be on a shared file system)"
    low = min(b["step"] for b in beats.values())
    at_low = [r for r, b in beats.items() if b["step"] == low]
    order = {p: i for i, p in enumerate(PHASES)}
    first = min(order.get(beats[r]["phase"], len(PHASES)) for r in at_low)
    stuck = sorted(r for r in at_low if order.get(beats[r]["phase"], len(PHASES)) == first)
    if len(stuck) == len(beats):
        phase = beats[stuck[0]]["phase"]
        return stuck, f"every rank is at step {low}, phase {phase}: one of them never reached the collective the " \
                      "others wait in; the stack dumps show which"
    return stuck, f"lowest step {low}, phase {beats[stuck[0]]['phase']} (the other ranks are further on)"


def verdict(beats: dict[int, dict], world: int, timeout: float) -> dict:
    ranks, why = behind(beats, world)
    lines = [f"HANG: no rank advanced for {timeout:g} s"]
    for r in ranks:
        b = beats.get(r)
        where = f"step {b['step']}, phase {b['phase']}" if b else "no heartbeat"
        lines.append(f"  behind: rank {r} on host {b['host'] if b else '?'} ({where})")
    lines.append(f"  {why}")
    hosts = {beats[r]["host"] for r in ranks if r in beats}
    # A host to blame (for the spare rule) only when some ranks, all on one host, hold the others up.
    culprit = hosts.pop() if len(hosts) == 1 and len(ranks) < world and all(r in beats for r in ranks) else None
    return {"timeout_s": timeout, "behind": ranks, "culprit_host": culprit, "why": why, "report": lines,
            "ranks": {str(r): beats[r] for r in sorted(beats)}}


class HangWatch:
    """Fed heartbeats and the time; returns the verdict once no rank changed step or phase for `timeout` seconds."""

    def __init__(self, world: int, timeout: float):
        self.world, self.timeout = world, timeout
        self.seen: dict[int, tuple] = {}
        self.last_progress: float | None = None

    def observe(self, beats: dict[int, dict], now: float) -> dict | None:
        for r, b in beats.items():
            key = (b["step"], b["phase"])
            if self.seen.get(r) != key:
                self.seen[r] = key
                if self.last_progress is not None or b["phase"] not in STARTUP:
                    self.last_progress = now
        if self.last_progress is not None and now - self.last_progress > self.timeout:
            return verdict(beats, self.world, self.timeout)
        return None


def write_verdict(path: Path, v: dict) -> None:
    """hang.json: created under a fresh name (exclusively, not through a planted link) and renamed."""
    write_private(path, json.dumps(v, indent=1))


def stack_targets(beats: dict[int, dict], hosts: list[str]) -> dict[str, list[int]]:
    """host -> pids to send the stack-dump signal to; only hosts of this launch's plan."""
    out: dict[str, list[int]] = {}
    for b in beats.values():
        if b["host"] in hosts:
            out.setdefault(b["host"], []).append(b["pid"])
    return {h: sorted(p) for h, p in sorted(out.items())}


def last_step(beats: dict[int, dict]) -> int | None:
    return max((b["step"] for b in beats.values()), default=None)


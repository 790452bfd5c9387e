"""The launcher's side of the hang watchdog and of restarts (launch/train.sh calls it; bash is the wrong tool for
reading JSON and ordering ranks).

    python launch/watchdog.py watch HEARTBEAT_DIR --world N --timeout S --out HANG.json
        Runs beside an attempt: reads the ranks' heartbeat files (recipes/train/heartbeat.py) every second or so and,
        when no rank has changed step or phase for S seconds (on this machine's clock: node clocks may differ),
        writes HANG.json (the verdict: every rank's step and phase, the ranks behind, a report) and exits 3. It arms
        itself when the first rank reaches the training loop: an entry point that writes no heartbeat is never
        called hung, and start-up is left to the distributed time-outs.
    python launch/watchdog.py pids HEARTBEAT_DIR        "host pid pid ..." per host: where to send SIGUSR2
    python launch/watchdog.py last-step HEARTBEAT_DIR   the highest step any rank reached (empty: no heartbeat)
    python launch/watchdog.py resume-step CKPT_DIR      the step of the newest complete checkpoint (0: none)
    python launch/watchdog.py field HANG.json KEY      one field of a verdict (lists comma-joined, lines one a line)
    python launch/watchdog.py record FILE key=value ... one JSON line appended to FILE (numbers stay numbers)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# The loop's phases in the order a step goes through them (recipes/train/loop.py): of the ranks at the lowest step,
# those in the earliest phase are behind (the others wait for them in a collective).
PHASES = ["start", "setup", "engine-setup", "resume", "data", "forward-backward", "log", "eval", "sync", "save",
          "done"]


# Start-up (imports, rendezvous, datasets, engine, checkpoint load) is not watched: its length varies with the
# machine's load and the checkpoint's size, and its collectives have their own limit (training.dist_timeout_minutes).
# The clock starts when the first rank reaches the training loop; ranks still starting up then are named as behind.
STARTUP = {"start", "setup", "engine-setup", "resume"}


def read_heartbeats(directory: str | Path) -> dict[int, dict]:
    out = {}
    for p in Path(directory).glob("rank-*.json"):
        try:
            rec = json.loads(p.read_text())
            out[int(rec["rank"])] = rec
        except (OSError, ValueError, KeyError, TypeError):
            continue  # replaced atomically by the rank, so only a vanished or foreign file lands here
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


def watch(directory: str, world: int, timeout: float, out: str, poll: float, for_s: float | None = None) -> int | None:
    """3 after writing a hang verdict to `out`; None when the launcher is gone or `for_s` seconds passed."""
    seen: dict[int, tuple] = {}
    last_progress = None
    parent = os.getppid()
    end = time.monotonic() + for_s if for_s else float("inf")
    while os.getppid() == parent and time.monotonic() < end:  # launcher gone (even SIGKILLed): nothing to watch
        beats = read_heartbeats(directory)
        now = time.monotonic()
        for r, b in beats.items():
            key = (b.get("step"), b.get("phase"))
            if seen.get(r) != key:
                seen[r] = key
                if last_progress is not None or b.get("phase") not in STARTUP:
                    last_progress = now
        if last_progress is not None and now - last_progress > timeout:
            v = verdict(beats, world, timeout)
            tmp = f"{out}.tmp"
            with open(tmp, "w") as f:
                json.dump(v, f, indent=1)
            os.replace(tmp, out)
            return 3
        time.sleep(poll)
    return None


def pids(directory: str) -> list[str]:
    by_host: dict[str, list[str]] = {}
    for b in read_heartbeats(directory).values():
        by_host.setdefault(b["host"], []).append(str(int(b["pid"])))
    return [f"{h} {' '.join(p)}" for h, p in sorted(by_host.items())]


def resume_step(ckpt_dir: str) -> int:
    if not ckpt_dir or not Path(ckpt_dir).is_dir():
        return 0
    import logging

    logging.disable(logging.WARNING)  # its notes about skipped partial saves belong to the run's own log
    from recipes.checkpoint.store import newest_complete

    tag = newest_complete(ckpt_dir)
    if tag is None:
        return 0
    return int(json.loads((Path(ckpt_dir) / tag / "complete.json").read_text())["step"])


def _value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return None if v == "" else v


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="launch/watchdog.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("watch")
    w.add_argument("dir")
    w.add_argument("--world", type=int, required=True)
    w.add_argument("--timeout", type=float, required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--poll", type=float, default=None)
    for name in ("pids", "last-step", "resume-step"):
        sub.add_parser(name).add_argument("dir")
    f = sub.add_parser("field")
    f.add_argument("file")
    f.add_argument("key")
    r = sub.add_parser("record")
    r.add_argument("file")
    r.add_argument("fields", nargs="*")
    a = ap.parse_args(argv)
    if a.cmd == "watch":
        return watch(a.dir, a.world, a.timeout, a.out, a.poll or min(1.0, a.timeout / 10)) or 0
    if a.cmd == "pids":
        print("\n".join(pids(a.dir)))
    elif a.cmd == "last-step":
        steps = [b["step"] for b in read_heartbeats(a.dir).values()]
        print(max(steps) if steps else "")
    elif a.cmd == "resume-step":
        print(resume_step(a.dir))
    elif a.cmd == "field":
        v = json.loads(Path(a.file).read_text()).get(a.key)
        if isinstance(v, list):
            print("\n".join(map(str, v)) if a.key == "report" else ",".join(map(str, v)))
        else:
            print("" if v is None else v)
    else:
        rec = {k: _value(v) for k, _, v in (f.partition("=") for f in a.fields)}
        with open(a.file, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

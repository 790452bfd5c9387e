"""Opt-in pytest plugin: where the suite's time goes, with CPU. For each test, its wall time (setup, call and
teardown) and the CPU of the pytest process's whole tree meanwhile: ranks, forked templates, ssh sessions and daemons
included, which `--durations` cannot tell from waiting.

    .venv/bin/python -m pytest -q -n 2 --dist loadfile -p tests.support.cpu_per_test tests

Each pytest process (each xdist worker) moves itself into a CPU-accounting cgroup of its own (cgroup v1 `cpuacct`, or
cgroup v2; root needed), which every process it starts inherits; without one it falls back to getrusage (itself and
the children it has waited for: a forked rank's CPU reaches it only through them). One TSV per process under
$CPU_PER_TEST_DIR (default ./cpu-per-test): test id, wall s, CPU s, source. The run ends with the slowest tests' CPU
and the totals per directory. Nothing is kept after the run: each group is removed once empty.
"""
from __future__ import annotations

import atexit
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")


def _out_dir() -> Path:
    return Path(os.environ.get("CPU_PER_TEST_DIR", "cpu-per-test"))


class _Meter:
    """CPU seconds of this process's tree: a cgroup of its own when one can be made, else getrusage."""

    def __init__(self, name: str):
        self.group, self.source = None, "rusage"
        for root, usage in ((V1, "cpuacct.usage"), (V2, "cpu.stat")):
            if not (root / usage).exists() and not (root / "cgroup.procs").exists():
                continue
            group = root / name
            try:
                group.mkdir(exist_ok=True)
                (group / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                continue
            self.group, self.parent, self.usage = group, root, group / usage
            self.source = "cgroup-v1" if root == V1 else "cgroup-v2"
            break

    def seconds(self) -> float:
        if self.group is None:
            return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                       for f in ("ru_utime", "ru_stime"))
        text = self.usage.read_text()
        if self.source == "cgroup-v1":
            return int(text) / 1e9
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6

    def close(self) -> None:
        """At exit (registered first, so it runs after the exit handlers that stop the run's helper processes): out
        of the group, then remove it once the last of them has gone."""
        if self.group is None:
            return
        try:
            (self.parent / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            pass
        for _ in range(50):
            try:
                self.group.rmdir()
                return
            except OSError as e:
                error = e
                time.sleep(0.1)
        print(f"cpu_per_test: {self.group} kept: a process of the run is still in it ({error}): "
              f"{'; '.join(self._members()) or 'none left now'}", file=sys.stderr)

    def _members(self) -> list[str]:
        """Who is still in the group, as `pid command line`: a process the run started and did not end."""
        try:
            pids = (self.group / "cgroup.procs").read_text().split()
        except OSError:
            return []
        rows = []
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            rows.append(f"{pid} {cmd.strip()[:200]}")
        return rows


def pytest_configure(config):
    name = f"pytest-cpu-{os.getpid()}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    config._cpu_meter = _Meter(name)
    atexit.register(config._cpu_meter.close)
    out = _out_dir()
    out.mkdir(parents=True, exist_ok=True)
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the run's first process: an earlier run's files go
        for old in out.glob("pytest-cpu-*.tsv"):
            old.unlink()
    config._cpu_tsv = open(out / f"{name}.tsv", "w", buffering=1)


def pytest_unconfigure(config):
    config._cpu_tsv.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    meter = item.config._cpu_meter
    cpu, wall = meter.seconds(), time.monotonic()
    yield
    item.config._cpu_tsv.write(f"{item.nodeid}\t{time.monotonic() - wall:.2f}\t{meter.seconds() - cpu:.2f}\t"
                               f"{meter.source}\n")


def read_rows(out: Path) -> list[tuple[str, float, float, str]]:
    rows = []
    for tsv in sorted(out.glob("pytest-cpu-*.tsv")):
        for line in tsv.read_text().splitlines():
            test, wall, cpu, source = line.split("\t")
            rows.append((test, float(wall), float(cpu), source))
    return rows


def pytest_terminal_summary(terminalreporter, config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    config._cpu_tsv.flush()
    rows = read_rows(_out_dir())
    if not rows:
        return
    tr = terminalreporter
    tr.section("CPU per test (wall s, CPU s of the process tree)")
    for test, wall, cpu, _ in sorted(rows, key=lambda r: -r[2])[:30]:
        tr.write_line(f"{wall:8.1f} {cpu:8.1f}  {test}")
    per_dir = defaultdict(lambda: [0.0, 0.0])
    for test, wall, cpu, _ in rows:
        folder = "/".join(test.split("::")[0].split("/")[:2])
        per_dir[folder][0] += wall
        per_dir[folder][1] += cpu
    tr.write_line("per directory (test time, CPU):")
    for folder, (wall, cpu) in sorted(per_dir.items(), key=lambda kv: -kv[1][1]):
        tr.write_line(f"{wall:8.1f} {cpu:8.1f}  {folder}")
    sources = sorted({r[3] for r in rows})
    tr.write_line(f"all: {sum(r[1] for r in rows):.1f} s of test time, {sum(r[2] for r in rows):.1f} s of CPU "
                  f"({', '.join(sources)}; files in {_out_dir()})")

"""tests/support/cpu_per_test.py, run by a real pytest on a small tree: a test that burns CPU in a process it never
waits for is charged that CPU where a cgroup can be made (the process tree), a sleeping test is charged none, and the
summary names both; no group is left behind."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cpu_per_test

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass\\n"
TESTS = f'''import subprocess, sys, time

def test_burns_in_a_process_it_never_waits_for():
    subprocess.Popen([sys.executable, "-c", "{BURN}"])
    time.sleep(2.0)  # the burner is done by then (0.6 s of CPU), and never reaped here


def test_sleeps():
    time.sleep(0.5)
'''


def test_each_test_is_charged_the_cpu_of_its_process_tree(tmp_path):
    (tmp_path / "test_two.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "cpu"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                        "tests.support.cpu_per_test", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=_env(PYTHONPATH=str(REPO), CPU_PER_TEST_DIR=str(out)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {test.split("::")[1]: (wall, cpu, source) for test, wall, cpu, source in cpu_per_test.read_rows(out)}
    assert set(rows) == {"test_burns_in_a_process_it_never_waits_for", "test_sleeps"}
    wall, cpu, source = rows["test_burns_in_a_process_it_never_waits_for"]
    assert wall >= 2.0
    if source.startswith("cgroup"):  # the unreaped burner's CPU is in the tree's account
        assert cpu >= 0.5, rows
    else:  # getrusage counts only what was waited for: said in the file, not hidden
        assert source == "rusage" and cpu < 0.5, rows
    wall, cpu, _ = rows["test_sleeps"]
    assert wall >= 0.5 and cpu < 0.2, rows
    assert "CPU per test" in r.stdout and "test_burns_in_a_process_it_never_waits_for" in r.stdout
    assert f"s of CPU ({source}; files in {out})" in r.stdout
    groups = [root / tsv.stem for tsv in out.glob("pytest-cpu-*.tsv") for root in (cpu_per_test.V1, cpu_per_test.V2)]
    assert len(groups) == 2 and not [g for g in groups if g.exists()], "a cgroup was left behind"


def _env(**extra) -> dict:
    """This environment without the xdist worker's variables: the inner pytest is a run of its own."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, **extra}

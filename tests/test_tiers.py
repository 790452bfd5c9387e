"""tests/conftest.py's tier rules, run by a real pytest on a small tree that uses this repository's conftest: a test
needs exactly one tier; `-m unit` skips files that never write `pytest.mark.unit`, and a full collection refuses a
unit test whose file would be skipped that way (so the shortcut can never drop a unit test)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

CONFTEST = Path(__file__).with_name("conftest.py")


def _pytest(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only", *args,
                           str(tree)], cwd=tree, capture_output=True, text=True, timeout=120)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    tree = tmp_path / "t"
    tree.mkdir()
    shutil.copy(CONFTEST, tree / "conftest.py")
    (tree / "pytest.ini").write_text("[pytest]\nmarkers =\n    unit: u\n    multiproc: m\n    ssh: s\n    gpu: g\n"
                                     "    network: n\n")
    for name, text in files.items():
        (tree / name).write_text("import pytest\n" + text)
    return tree


def test_unit_tier_skips_files_without_the_mark_and_full_runs_refuse_a_hidden_unit_test(tmp_path):
    tree = _tree(tmp_path, {
        "test_plain.py": "pytestmark = pytest.mark.unit\ndef test_a(): pass\n",
        "test_slow.py": "pytestmark = pytest.mark.multiproc\ndef test_b(): pass\n",
    })
    r = _pytest(tree, "-m", "unit")
    assert r.returncode == 0 and "test_plain.py::test_a" in r.stdout and "test_slow" not in r.stdout, r.stdout
    (tree / "test_hidden.py").write_text("import pytest\npytestmark = getattr(pytest.mark, 'u' + 'nit')\n"
                                         "def test_c(): pass\n")
    (tree / "test_none.py").write_text("def test_d(): pass\n")
    r = _pytest(tree)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "test_hidden.py::test_c: unit, but its file never says" in out, out
    assert "test_none.py::test_d: tiers none" in out and "test_plain.py" not in out.split("tier marker")[-1], out

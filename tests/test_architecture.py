"""The import direction is one way (pyproject.toml's import-linter contracts): the real tree keeps every contract,
and a planted wrong-way import in a copy of it breaks one. Tests import code as users do, by package name: none puts
a folder on sys.path or loads a module from a file path."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
LINT = str(Path(sys.executable).with_name("lint-imports"))


# tests/support's two fork servers run a command's module or script as `python -m X` / `python FILE` would: that is
# their job, not an import of product code
BY_PATH = re.compile(r"sys\.path\.(insert|append)|spec_from_file_location|SourceFileLoader|runpy\.run_path")
RUNS_COMMANDS = {"tests/support/forkserver.py", "tests/support/rank_forks.py"}


def imports_by_path(root: Path) -> list[str]:
    hits = []
    for path in sorted((root / "tests").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name in RUNS_COMMANDS or name == "tests/test_architecture.py":
            continue
        hits += [f"{name}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1) if BY_PATH.search(line)]
    return hits


def _lint(root: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH: the copy's packages, not the editable install's, are the ones analysed.
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([LINT, "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def _copy(tmp: Path) -> Path:
    for pkg in ("recipes", "data_prep", "launch"):
        shutil.copytree(REPO / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def test_the_tree_keeps_every_import_contract():
    r = _lint(REPO)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("module,planted,contract", [
    ("recipes/config/schema.py", "import recipes.tools.demo", "recipes.config is not allowed to import recipes.tools"),
    ("recipes/model/shape.py", "from recipes.planner import cost", "recipes.model is not allowed to import recipes.planner"),
    ("data_prep/io.py", "import recipes.config.loading", "data_prep imports nothing from recipes"),
    ("recipes/train/data.py", "from data_prep.read import units", "recipes is not allowed to import data_prep.read"),
    ("recipes/train/trainer.py", "import launch.supervise", "recipes is not allowed to import launch"),
    ("launch/hostfile.py", "import recipes.train.trainer", "launch is not allowed to import recipes.train"),
    ("recipes/checkpoint/format/read.py", "from recipes.checkpoint import store",
     "recipes.checkpoint.format is not allowed to import recipes.checkpoint.store"),
])
def test_a_wrong_way_import_breaks_the_build(tmp_path, module, planted, contract):
    root = _copy(tmp_path)
    target = root / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    r = _lint(root)
    assert r.returncode != 0, r.stdout[-3000:]
    assert contract in r.stdout and "BROKEN" in r.stdout, r.stdout[-3000:]


def test_no_test_imports_code_by_path(tmp_path):
    assert imports_by_path(REPO) == []
    planted = tmp_path / "tests" / "recipes" / "test_planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("import sys\nsys.path.insert(0, 'docs')\n")
    assert imports_by_path(tmp_path) == ["tests/recipes/test_planted.py:2"]


SHARED_WITH_RECIPES = ("data_prep", "data_prep.__main__", "data_prep.io", "data_prep.file_modes", "data_prep.objstore",
                       "data_prep.lazy_compile", "data_prep.write", "data_prep.write.shards", "data_prep.write.verify",
                       "data_prep.steps", "data_prep.steps.tokenizers")


def test_every_data_prep_module_is_either_shared_with_recipes_or_forbidden_to_it():
    """A new data_prep module must be put on one side of the shared-layer contract (else recipes could import it
    unnoticed): the contract's forbidden list plus the shared layer cover every module."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    forbidden = next(c["forbidden_modules"] for c in contracts if c["name"].startswith("recipes takes from data_prep"))
    modules = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
               for p in (REPO / "data_prep").rglob("*.py")}
    unplaced = sorted(m for m in modules if m not in SHARED_WITH_RECIPES
                      and not any(m == f or m.startswith(f + ".") for f in forbidden))
    assert unplaced == [], f"place these in pyproject.toml's shared-layer contract or SHARED_WITH_RECIPES: {unplaced}"


def long_functions(root: Path, limit: int = 60) -> list[str]:
    import ast

    found = []
    for pkg in ("recipes", "launch"):
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_recipes_or_launch_is_over_60_lines(tmp_path):
    assert long_functions(REPO) == []
    planted = tmp_path / "launch" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("def f():\n" + "    x = 1\n" * 60)
    (tmp_path / "recipes").mkdir()
    assert long_functions(tmp_path) == ["launch/planted.py:1 f (61 lines)"]

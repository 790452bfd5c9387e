"""The command line speaks for itself: --version on every entry point (the version pyproject.toml declares), examples
in --help whose flags the command has, and descriptions that are whole sentences (issue 26, item 4)."""
from __future__ import annotations

import ast
import functools
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from recipes.__main__ import COMMANDS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=REPO, capture_output=True, text=True, timeout=120)


def test_version_on_every_entry_point():
    for cmd in ([sys.executable, "-m", "recipes", "--version"], [sys.executable, "-m", "recipes", "-V"],
                [sys.executable, "-m", "data_prep", "--version"], ["bash", "launch/train.sh", "--version"]):
        r = run(*cmd)
        assert r.returncode == 0 and f"llm-recipes {VERSION}" in r.stdout, (cmd, r.stdout, r.stderr)


@functools.cache
def help_of(command: str) -> str:
    r = run(sys.executable, "-m", "recipes", command, "--help")
    assert r.returncode == 0, r.stderr
    return r.stdout


def examples(help_text: str) -> list[str]:
    """The example command lines after 'examples:', continuation lines (ending in '\\') joined."""
    assert "\nexamples:\n" in help_text
    joined = help_text.split("\nexamples:\n", 1)[1].replace("\\\n", " ")
    return [line.split("   #")[0].strip() for line in joined.splitlines() if line.strip()]


@pytest.mark.parametrize("command", ["train", "render", "reshape", "export-hf"])
def test_help_examples_use_only_flags_the_command_has_and_files_that_exist(command):
    text = help_of(command)
    options = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z-]*)", text.split("\noptions:\n", 1)[1], re.M))
    own = [e for e in examples(text) if e.startswith(f"python -m recipes {command} ")]
    assert own, text
    for example in own:
        words = example.split()
        unknown = [w for w in words if w.startswith("--") and w.split("=")[0] not in options]
        assert not unknown, (example, unknown, sorted(options))
        for word in words:
            if word.startswith("configs/"):
                assert (REPO / word).is_file(), example


def test_render_examples_run(tmp_path):
    for i, example in enumerate(e for e in examples(help_of("render")) if e.startswith("python -m recipes render")):
        words = example.split()[4:]
        words[words.index("--out") + 1] = str(tmp_path / str(i))
        r = run(sys.executable, "-m", "recipes", "render", *words, "-q")
        assert r.returncode == 0, (example, r.stderr)
        assert (tmp_path / str(i) / "ds_config.json").is_file() and (tmp_path / str(i) / "resolved.yaml").is_file()


def _commands_with_a_parser() -> dict[str, str]:
    """command line -> module: every top-level command but plan (it prints its whole docstring) and the bench group
    (a dispatcher with its own usage), plus each benchmark of that group."""
    from recipes.tools.bench import BENCHMARKS
    top = {f"python -m recipes {c}": COMMANDS[c][0] for c in COMMANDS if c not in ("plan", "bench")}
    return top | {f"python -m recipes bench {name}": module for name, (module, _) in BENCHMARKS.items()}


@pytest.mark.parametrize("command", sorted(_commands_with_a_parser()))
def test_descriptions_are_whole_sentences(command):
    """Each command's --help description is the whole first paragraph of its module docstring (read here from the
    source, without importing torch), and that paragraph ends a sentence: the first *line* of several is half of one."""
    path = Path(importlib.util.find_spec(_commands_with_a_parser()[command]).origin)
    source = path.read_text()
    paragraph = " ".join(ast.get_docstring(ast.parse(source)).split("\n\n")[0].split())
    assert paragraph.endswith((".", ".`", "?")), (command, paragraph)
    assert f'command_parser("{command}", __doc__' in source, command


def test_the_descriptions_cut_mid_sentence_before_are_whole():
    assert "for continued pretraining (step 0, fresh optimizer, the model's weights)." in \
        " ".join(help_of("import-hf").split())
    assert "so that the run resumes under the new layout with `recipes.train.cli`." in \
        " ".join(help_of("reshape").split())


def test_count_refuses_what_is_not_a_count_naming_the_value(capsys):
    import argparse

    from recipes.config.cli_help import count

    ap = argparse.ArgumentParser(prog="p")
    ap.add_argument("--local", type=count(1))
    assert ap.parse_args(["--local", "2"]).local == 2
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            ap.parse_args(["--local", bad])
        assert capsys.readouterr().err.strip().endswith(
            f"argument --local: wants a whole number of at least 1, got '{bad}'")


def test_train_local_0_is_refused_by_the_parser():
    """`recipes train --local 0` started no launcher and ran as a lone rank, dying with a torch.distributed
    traceback: now one parser line naming the value, exit 2."""
    import subprocess
    import sys

    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "recipes", "train", "--config", "configs/runs/tiny-cpu.yaml", "--local",
                        "0"], capture_output=True, text=True, timeout=120, cwd=repo)
    assert r.returncode == 2 and "argument --local: wants a whole number of at least 1, got '0'" in r.stderr
    assert "Traceback" not in r.stderr

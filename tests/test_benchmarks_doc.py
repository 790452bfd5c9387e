"""docs/benchmarks.md, the table of the project's current figures, is what docs/make_benchmarks_doc.py renders from
docs/benchmarks.yaml (the generator's own --check, run as a contributor runs it); the generator refuses an entry
without its date, machine or command, naming it; and every figure's command names a command that exists
(`python -m recipes X`: X in recipes/__main__.py's COMMANDS; `python -m data_prep X`: a subcommand of data_prep's own
parser; flags, modules, scripts and recipe fields as tests/support/doc_commands.py checks the docs' commands)."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipes.__main__ import COMMANDS
from tests.support import doc_commands as dc

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "docs" / "benchmarks.yaml"


def _generator(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "docs/make_benchmarks_doc.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def command_problems(command: str) -> list[str]:
    """Why a figure's command could not run as written: a recipes / data_prep command that does not exist, an
    unknown flag, module, script or recipe field."""
    words = shlex.split(command)
    prog = dc.program_of(words)
    if prog is None:
        return [f"`{command}`: not a command of this repository (python -m ..., a script, launch/*.sh, torchrun)"]
    kind, name, argv = prog
    out = []
    if kind == "module" and name == "recipes" and (not argv or argv[0] not in COMMANDS):
        out.append(f"`{command}`: python -m recipes has no command {argv[0] if argv else '(none)'!r} "
                   f"(recipes/__main__.py COMMANDS: {', '.join(COMMANDS)})")
    if kind == "module" and name == "data_prep":
        parser = dc.parser_of("data_prep")[0]
        if not argv or dc.subparser(parser, argv[0]) is None:
            out.append(f"`{command}`: python -m data_prep has no command {argv[0] if argv else '(none)'!r}")
    cmd = dc.Command("docs/benchmarks.yaml", command, words, inline=True)
    return out + [f"`{command}`: {why}" for why in dc.problems(cmd)]


def test_benchmarks_md_is_what_the_yaml_renders_to():
    check = _generator("--check")
    assert check.returncode == 0, check.stderr + "\n(then commit both files)"


def test_every_figure_has_a_command_that_exists():
    figures = yaml.safe_load(FIGURES.read_text())["figures"]
    assert len(figures) >= 40
    found = [f"figures[{n}] ({f['what'][:50]!r}): {why}" for n, f in enumerate(figures)
             for why in command_problems(f["command"])]
    assert not found, "\n".join(found)


def test_the_command_check_finds_planted_commands():
    assert command_problems("python -m recipes bench-checksums --mib 512 --repeat 3") == []
    assert command_problems("python -m data_prep bench-datatrove web.jsonl --max-mb 16") == []
    assert command_problems("OMP_NUM_THREADS=1 python -m recipes bench-moe model.hidden_size=512") == []
    assert "python -m recipes has no command 'bench-resharding'" in command_problems(
        "python -m recipes bench-resharding --data MANIFEST")[0]
    assert "python -m data_prep has no command 'bench-verify'" in command_problems(
        "python -m data_prep bench-verify --mb 1024")[0]
    assert any("has no option --mebibytes" in why for why in command_problems(
        "python -m recipes bench-checksums --mebibytes 512"))
    assert any("no field 'hidden'" in why for why in command_problems(
        "python -m recipes bench-moe model.hidden=512"))
    assert command_problems("cat results.txt") and command_problems("python -m recipes")


def _planted(tmp_path: Path, change) -> Path:
    raw = yaml.safe_load(FIGURES.read_text())
    change(raw)
    path = tmp_path / "benchmarks.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_entries_without_date_machine_or_command_and_a_piped_command_are_refused_naming_them(tmp_path):
    raw = yaml.safe_load(FIGURES.read_text())

    def change(raw):
        for n, field in ((2, "date"), (3, "machine"), (4, "command")):
            raw["figures"][n].pop(field)
        raw["figures"][1]["command"] = "python -m recipes demo | tail -3"
    r = _generator("--check", "--yaml", str(_planted(tmp_path, change)), "--out", str(tmp_path / "out.md"))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    for n, field in ((2, "date"), (3, "machine"), (4, "command")):
        assert f"figures[{n}] ({raw['figures'][n]['what'][:60]!r}): {field}: Field required" in r.stderr, lines
    assert any("figures[1]" in line and "must hold no '|'" in line for line in lines), lines
    assert len(lines) == 4, lines


def test_an_unknown_area_an_empty_area_and_a_bad_link_are_refused(tmp_path):
    def change(raw):
        raw["figures"][0]["area"] = "mainjob"
        raw["figures"][5]["doc"] = "no_such_page.md"
        raw["figures"][6]["doc"] = "cluster.md#no-such-heading"
        raw["figures"] = [f for f in raw["figures"] if f["area"] != "gpu"]  # the last area: indexes above unchanged
    r = _generator("--yaml", str(_planted(tmp_path, change)), "--out", str(tmp_path / "out.md"))
    assert r.returncode == 2 and not (tmp_path / "out.md").exists(), r.stdout + r.stderr
    assert "figures[0]" in r.stderr and "area: 'mainjob' is not one of the areas" in r.stderr
    assert "figures[5]" in r.stderr and "no page docs/no_such_page.md" in r.stderr
    assert "figures[6]" in r.stderr and "docs/cluster.md has no heading #no-such-heading" in r.stderr
    assert "areas: 'gpu' has no figure" in r.stderr


def test_a_stale_table_is_found_and_rewritten(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text((REPO / "docs" / "benchmarks.md").read_text().replace("0.550 s", "0.55 s"))
    args = ["--yaml", str(FIGURES), "--out", str(out)]
    check = _generator("--check", *args)
    assert check.returncode == 1 and "is not what docs/benchmarks.yaml gives" in check.stderr, check.stderr
    assert _generator(*args).returncode == 0
    assert out.read_text() == (REPO / "docs" / "benchmarks.md").read_text()

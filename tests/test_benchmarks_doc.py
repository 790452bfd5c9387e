"""docs/benchmarks.md, the table of the project's current figures, is what docs/make_benchmarks_doc.py renders from
docs/benchmarks.yaml; the YAML names a date, a machine and a command for every figure, and every command names a
command that exists (`python -m recipes X`: X in recipes/__main__.py's COMMANDS; `python -m data_prep X`: a
subcommand of data_prep's own parser; flags, modules, scripts and overrides as tests/support/doc_commands.py checks
the docs' commands)."""
from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from recipes.__main__ import COMMANDS
from tests.support import doc_commands as dc

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("make_benchmarks_doc", REPO / "docs" / "make_benchmarks_doc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through it
    spec.loader.exec_module(module)
    return module


GEN = _generator()


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
    assert GEN.stale() == [], "\n".join(GEN.stale())
    assert GEN.main(["--check"]) == 0  # what a contributor runs


def test_every_figure_has_a_date_a_machine_and_a_command_that_exists():
    doc = GEN.load()
    assert len(doc.figures) >= 40 and {f.area for f in doc.figures} == {a.id for a in doc.areas}
    found = [f"figures[{n}] ({f.what[:50]!r}): {why}" for n, f in enumerate(doc.figures)
             for why in command_problems(f.command)]
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
    assert command_problems("cat results.txt") and command_problems("python -m recipes") != []


def _planted(tmp_path: Path, change) -> Path:
    raw = yaml.safe_load(GEN.YAML.read_text())
    change(raw)
    path = tmp_path / "benchmarks.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("field", ["date", "machine", "command"])
def test_an_entry_without_its_date_machine_or_command_is_refused_naming_it(tmp_path, field):
    path = _planted(tmp_path, lambda raw: raw["figures"][2].pop(field))
    with pytest.raises(GEN.BenchmarksError) as e:
        GEN.load(path)
    what = yaml.safe_load(GEN.YAML.read_text())["figures"][2]["what"]
    assert e.value.lines == [f"{path}: figures[2] ({what[:60]!r}): {field}: Field required"]


def test_an_unknown_area_an_empty_area_a_bad_link_and_a_piped_command_are_refused(tmp_path):
    def change(raw):
        raw["figures"][0]["area"] = "mainjob"
        raw["figures"][1]["command"] = "python -m recipes demo | tail -3"
        raw["figures"][5]["doc"] = "no_such_page.md"
        raw["figures"][6]["doc"] = "cluster.md#no-such-heading"
        raw["figures"] = [f for f in raw["figures"] if f["area"] != "gpu"]  # the last area: indexes above unchanged
    with pytest.raises(GEN.BenchmarksError) as e:
        GEN.load(_planted(tmp_path, change))
    text = "\n".join(e.value.lines)
    assert "figures[1]" in text and "must hold no '|'" in text
    # the pipe is refused by the schema, before the cross-checks: fix it, and the rest is named
    def change_but_the_pipe(raw):
        change(raw)
        raw["figures"][1]["command"] = "python -m recipes demo"
    with pytest.raises(GEN.BenchmarksError) as e:
        GEN.load(_planted(tmp_path, change_but_the_pipe))
    text = "\n".join(e.value.lines)
    assert "figures[0]" in text and "area: 'mainjob' is not one of the areas" in text
    assert "figures[5]" in text and "no page docs/no_such_page.md" in text
    assert "figures[6]" in text and "docs/cluster.md has no heading #no-such-heading" in text
    assert "areas: 'gpu' has no figure" in text


def test_a_stale_table_is_found(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text(GEN.render(GEN.load()).replace("0.550 s", "0.55 s"))
    assert GEN.stale(GEN.YAML, out) and "is not what docs/benchmarks.yaml gives" in GEN.stale(GEN.YAML, out)[0]
    out.write_text(GEN.render(GEN.load()))
    assert GEN.stale(GEN.YAML, out) == []

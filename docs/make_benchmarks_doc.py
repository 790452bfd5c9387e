"""Render docs/benchmarks.md, the table of the project's current figures, from docs/benchmarks.yaml.

    .venv/bin/python docs/make_benchmarks_doc.py            # rewrite docs/benchmarks.md
    .venv/bin/python docs/make_benchmarks_doc.py --check    # exit 1 if docs/benchmarks.md is not what the YAML gives

A new measurement replaces its entry in the YAML (the old one stays in git history), then this script runs. The YAML
is validated first: an entry without its date, machine or command, an unknown area, an area with no figure or a link
to a missing page is refused (exit 2) with one line per problem naming the entry. tests/test_benchmarks_doc.py fails
when docs/benchmarks.md is stale and when a command names a `recipes` / `data_prep` command that does not exist.
"""
from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError, field_validator

REPO = Path(__file__).resolve().parents[1]
YAML = REPO / "docs" / "benchmarks.yaml"
OUT = REPO / "docs" / "benchmarks.md"

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class BenchmarksError(Exception):
    """The YAML cannot be rendered; `lines` says why, one problem per line."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


class Area(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Text
    title: Text
    doc: str = ""  # the page that explains the area's methods, relative to docs/
    note: str = ""  # how the inputs are made, what the rates are over


class Figure(BaseModel):
    model_config = ConfigDict(extra="forbid")
    area: Text
    what: Text
    figure: Text
    baseline: str = ""  # the ratio against the baseline run side by side, where there is one
    date: datetime.date
    machine: Text
    command: Text
    doc: str = ""

    @field_validator("command")
    @classmethod
    def _one_code_span(cls, value: str) -> str:
        # rendered as one code span in a table cell: a pipe would end the cell, a backtick the span
        bad = [c for c in ("|", "`", "\n") if c in value]
        if bad:
            raise ValueError(f"a command must hold no {' or '.join(map(repr, bad))} (it is one code span of a table "
                             "cell): give the one command that prints the figure")
        return value


class Benchmarks(BaseModel):
    model_config = ConfigDict(extra="forbid")
    placeholders: dict[str, Text] = {}
    areas: list[Area]
    figures: list[Figure]


def _label(raw: dict, loc: tuple) -> str:
    """`figures[3] ('The whole suite ...')` for a pydantic error location."""
    if len(loc) >= 2 and loc[0] in ("figures", "areas") and isinstance(loc[1], int):
        items = raw.get(loc[0]) or []
        item = items[loc[1]] if loc[1] < len(items) and isinstance(items[loc[1]], dict) else {}
        name = str(item.get("what") or item.get("id") or "")
        name = f" ({name[:60]!r})" if name else ""
        field = ".".join(map(str, loc[2:]))
        return f"{loc[0]}[{loc[1]}]{name}" + (f": {field}" if field else "")
    return ".".join(map(str, loc)) or "the file"


def _cross_problems(doc: Benchmarks) -> list[str]:
    ids = [a.id for a in doc.areas]
    out = [f"areas: '{i}' is listed twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for n, f in enumerate(doc.figures):
        if f.area not in ids:
            out.append(f"figures[{n}] ({f.what[:60]!r}): area: '{f.area}' is not one of the areas ({', '.join(ids)})")
    used = {f.area for f in doc.figures}
    out += [f"areas: '{a.id}' has no figure: remove it or add its figures" for a in doc.areas if a.id not in used]
    links = [(f"areas[{n}] ({a.id!r})", a.doc) for n, a in enumerate(doc.areas)]
    links += [(f"figures[{n}] ({f.what[:60]!r})", f.doc) for n, f in enumerate(doc.figures)]
    for where, link in links:
        page, _, anchor = link.partition("#")
        if link and not (REPO / "docs" / page).is_file():
            out.append(f"{where}: doc: no page docs/{page}")
        elif anchor and anchor not in _anchors(REPO / "docs" / page):
            out.append(f"{where}: doc: docs/{page} has no heading #{anchor}")
    return out


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#").strip()) for line in page.read_text().splitlines() if line.startswith("#")}


def load(path: Path = YAML) -> Benchmarks:
    """The validated YAML; BenchmarksError naming every problem (the file, the entry, the field) otherwise."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise BenchmarksError([f"{_shown(path)}: {e}"]) from None
    if not isinstance(raw, dict):
        raise BenchmarksError([f"{_shown(path)}: expected a mapping with placeholders, areas and figures"])
    try:
        doc = Benchmarks.model_validate(raw)
    except ValidationError as e:
        raise BenchmarksError([f"{_shown(path)}: {_label(raw, err['loc'])}: {err['msg']}"
                              for err in e.errors()]) from None
    problems = _cross_problems(doc)
    if problems:
        raise BenchmarksError([f"{_shown(path)}: {p}" for p in problems])
    return doc


# ---------------------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------------------

INTRO = """\
# Benchmarks: the current figures

<!-- Generated by docs/make_benchmarks_doc.py from docs/benchmarks.yaml: edit the YAML, then run the script. -->

Every figure the project quotes, one row each, with the day it was measured, the machine and the command that
reproduces it. Only the newest measurement of each is here; earlier rounds are in git history
(`git log -p docs/benchmarks.yaml`, and the docs' own history). The pages linked from each section say how the
figures are measured and what bounds them.

How to read them:
- A figure is whole-process (start-up, reading and writing included) unless its row says what is timed; CPU seconds
  are given where the machine was shared, since wall time under load measures the neighbours.
- "vs baseline" is a ratio against a baseline run side by side in the same sitting (alternated where the row says
  so), never against a figure from another day: the development machines are shared 2-core VMs whose load moves a
  single figure by up to 2x, and two of them differ by ~2x in speed.
- The date is the day of the measurement; where a figure was recorded without one, the day of the commit that
  recorded it. "Load" is the machine's load average during the run.
- Commands run from the repository root with the project's venv (`.venv/bin/python` as `python`); upper-case words
  are placeholders:
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "-"


def _slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _area_section(area: Area, figures: list[Figure]) -> list[str]:
    lines = ["", f"## {area.title}", ""]
    about = " ".join(area.note.split())
    if area.doc:
        about += (" " if about else "") + f"How they are measured: [{area.doc.split('#')[0]}]({area.doc})."
    if about:
        lines += [about, ""]
    lines += ["| what | figure | vs baseline | date | machine | command |", "|---|---|---|---|---|---|"]
    for f in figures:
        what = _cell(f.what) + (f" ([{f.doc.split('#')[0]}]({f.doc}))" if f.doc and f.doc != area.doc else "")
        lines.append(f"| {what} | {_cell(f.figure)} | {_cell(f.baseline)} | {f.date.isoformat()} | "
                     f"{_cell(f.machine)} | `{f.command}` |")
    return lines


def render(doc: Benchmarks) -> str:
    lines = INTRO.splitlines()
    lines += [f"  - `{name}`: {_cell(text)}" for name, text in doc.placeholders.items()]
    lines += ["", "Sections: " + " · ".join(f"[{a.title}](#{_slug(a.title)})" for a in doc.areas) + "."]
    for area in doc.areas:
        lines += _area_section(area, [f for f in doc.figures if f.area == area.id])
    return "\n".join(lines) + "\n"


def stale(yaml_path: Path = YAML, out_path: Path = OUT) -> list[str]:
    """What is wrong with out_path: empty when it is exactly what yaml_path renders to."""
    current = out_path.read_text() if out_path.is_file() else ""
    if current == render(load(yaml_path)):
        return []
    return [f"{_shown(out_path)} is not what {_shown(yaml_path)} gives: run .venv/bin/python "
            "docs/make_benchmarks_doc.py (and commit both)"]


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="docs/make_benchmarks_doc.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is not current")
    ap.add_argument("--yaml", type=Path, default=YAML, help="the figures (default: docs/benchmarks.yaml)")
    ap.add_argument("--out", type=Path, default=OUT, help="the page (default: docs/benchmarks.md)")
    args = ap.parse_args(argv)
    try:
        problems = stale(args.yaml, args.out)
        if args.check:
            print("\n".join(problems) or f"{_shown(args.out)} is current", file=sys.stderr if problems else sys.stdout)
            return 1 if problems else 0
        if problems:
            args.out.write_text(render(load(args.yaml)))
            print(f"wrote {_shown(args.out)}")
    except BenchmarksError as e:
        print("\n".join(e.lines), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

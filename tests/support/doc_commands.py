"""The commands README.md and docs/*.md show, found and checked against the real command lines (for
tests/test_docs_commands.py).

Found: every line of a ```bash block (continuations joined, comments and heredoc bodies dropped, `&&` / `;` / `|`
split), every `$ ` line of a plain ``` block, and every inline `code span` that starts with a command (`python -m
...`, `launch/...sh`, `recipes <command>`, `data_prep <command>`). Checked without running anything heavy:

- the module (`python -m X`) or script (`launch/train.sh`, `tests/support/x.py`) exists;
- `recipes` / `data_prep` commands: the command exists and every `--flag` is an option of that command's real
  argparse parser (the parser the command's `main` builds, taken before it parses); a block command without
  placeholders (`...`, `<x>`, `[x]`, `RECIPE`, `$VAR`) is parsed whole by that parser (argparse's own errors: an
  unrecognized argument, an invalid choice, a missing required option); `-- ARGS` of `data_prep slurm|probe` and of
  `launch/prep.sh` are checked as the tokenize / curate command they are;
- `section.key=value` overrides name fields of the recipe schema; preset names (`models/x`, `clusters/x`) and repo
  paths given as inputs exist;
- the launcher's shims and other scripts: every `--flag` appears in the shim's `--help` (or, for other scripts, in
  the script itself).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import importlib.util
import io
import logging
import re
import shlex
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHIMS = ("launch/train.sh", "launch/preflight.sh", "launch/stop.sh", "launch/prep.sh")
PYTHONS = re.compile(r"^(?:\S*/)?python3?(?:\.\d+)?$|^\$\{?PY(?:THON)?\}?$")
REPO_DIRS = ("configs/", "launch/", "tests/", "recipes/", "data_prep/", "docs/", ".ci/")
OUTPUT_FLAGS = {"-o", "--out", "--output", "--write-recipe", "--model-prefix", "--log-dir", "--dir"}
PRESET = re.compile(r"^(models|clusters|runs|examples)/[\w.-]+$")
PRODUCING_OVERRIDES = ("checkpoint.dir=",)  # a run writes its checkpoint directory: later commands may read it
OVERRIDE = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)=")
PLACEHOLDER = re.compile(r"\.\.\.|^<|>$|^\[|\]$|^\$|^[A-Z][A-Z0-9_]*(?:\.[a-z]+)?$|^[a-z]+(?:\|[a-z]+)+$")


@dataclass
class Command:
    where: str  # file:line
    text: str  # as the document shows it (continuations joined)
    words: list[str]
    inline: bool  # from a code span in prose: often a fragment, so only names and flags are checked

    def __str__(self) -> str:
        return f"{self.where}: `{self.text}`"


# ---------------------------------------------------------------------------------------------------------------------
# Finding the commands
# ---------------------------------------------------------------------------------------------------------------------

def _split_compound(words: list[str]) -> list[list[str]]:
    out, cur = [], []
    for w in words:
        if w in ("&&", "||", ";", "|"):
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    return [c for c in out + [cur] if c]


def _words(text: str) -> list[str] | None:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote: not a command line we can read
        return None


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def block_commands(path: Path) -> list[Command]:
    """Commands of the fenced blocks of one markdown file."""
    rel, lines = _rel(path), path.read_text().splitlines()
    out, fence, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*```(\S*)", line)
        if m:
            fence = None if fence is not None else m.group(1)
            i += 1
            continue
        if fence is None or fence not in ("bash", "sh", "shell", "console", ""):
            i += 1
            continue
        start, text = i + 1, line.strip()
        if fence == "" or text.startswith("$ "):
            if not text.startswith("$ "):  # a plain block shows output; only its `$ ` lines are commands
                i += 1
                continue
            text = text[2:]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", text)
        if heredoc:  # skip the body
            while i + 1 < len(lines) and lines[i + 1].strip() != heredoc.group(1):
                i += 1
            i += 1
        words = _words(text)
        for part in _split_compound(words or []):
            out.append(Command(f"{rel}:{start}", text.split(" #")[0].strip(), part, inline=False))
        i += 1
    return out


INLINE_START = re.compile(r"^(?:\S*python3?\s+-m\s+\S|(?:bash\s+)?\.?/?launch/\S+\.sh\b|(?:recipes|data_prep)\s+[a-z]"
                          r"|llm-recipes\b|data-prep\b|torchrun\s|(?:pretrain|pretrain_gpt)\s+-)")
# Names the project's commands once had: a doc that still shows one is stale.
RETIRED = {"pretrain": "training is `python -m recipes train` (or launch/train.sh)"}


def inline_commands(path: Path) -> list[Command]:
    rel, out, fence = _rel(path), [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", line):
            text = m.group(1).strip()
            if INLINE_START.match(text):
                for part in _split_compound(_words(text) or []):
                    out.append(Command(f"{rel}:{n}", text, part, inline=True))
    return out


def all_commands(docs: list[Path] = DOCS) -> list[Command]:
    return [c for p in docs for c in block_commands(p) + inline_commands(p)]


def code_span_paths(docs: list[Path] = DOCS) -> list[tuple[str, str]]:
    """(file:line, path) for every code span in prose that is a path into this repository (e.g. `launch/prep.sh`,
    `recipes/train/loop.py`): moved files leave these behind."""
    out = []
    for path in docs:
        fence = False
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            if fence:
                continue
            for m in re.finditer(r"(?<!`)`([^`\s]+)`(?!`)", line):
                word = m.group(1).rstrip(".,:;")
                if word.startswith(REPO_DIRS) and not PLACEHOLDER.search(word) and "*" not in word:
                    out.append((f"{_rel(path)}:{n}", word))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# What a command is: (program, argv)
# ---------------------------------------------------------------------------------------------------------------------

def program_of(words: list[str]) -> tuple[str, str, list[str]] | None:
    """('module', name, argv) or ('script', repo-relative path, argv), or None for a command we do not own (cat,
    ssh, pip, sbatch...)."""
    w = list(words)
    while w and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w[0]):  # VAR=value prefixes
        w.pop(0)
    if w and w[0] in ("bash", "sh", "exec"):
        w.pop(0)
    if not w:
        return None
    head = w[0]
    if head in RETIRED:
        return "retired", head, w[1:]
    if head in ("llm-recipes", "recipes"):
        return "module", "recipes", w[1:]
    if head in ("data-prep", "data_prep"):
        return "module", "data_prep", w[1:]
    if head in ("torchrun", "deepspeed") or PYTHONS.match(head):
        if "-m" in w:
            k = w.index("-m")
            return ("module", w[k + 1], w[k + 2:]) if k + 1 < len(w) else None
        if PYTHONS.match(head):
            script = next((x for x in w[1:] if not x.startswith("-")), None)
            if script and script.endswith(".py") and "-c" not in w:
                return "script", script, w[w.index(script) + 1:]
        return None
    if re.match(r"^(\./)?launch/\S+\.sh$", head) or head.endswith(".sh") and head.startswith(REPO_DIRS):
        return "script", head.removeprefix("./"), w[1:]
    return None


def has_placeholder(argv: list[str]) -> bool:
    return any(PLACEHOLDER.search(a) for a in argv)


# ---------------------------------------------------------------------------------------------------------------------
# The real parsers
# ---------------------------------------------------------------------------------------------------------------------

class _Reached(BaseException):  # past any `except Exception` in a main
    def __init__(self, parser: argparse.ArgumentParser, method: str):
        super().__init__(method)
        self.parser, self.method = parser, method


OWN = ("recipes", "data_prep", "launch", "tests")


def main_of(module: str):
    """The `main(argv)` that `python -m MODULE` runs (a package's __main__ dispatches to its cli's main)."""
    entry = {"recipes": "recipes.__main__", "data_prep": "data_prep.cli", "launch": "launch.cli"}.get(module, module)
    return getattr(importlib.import_module(entry), "main", None)


@functools.cache
def parser_of(module: str, command: str = "") -> tuple[argparse.ArgumentParser, str] | None:
    """The parser `python -m MODULE [COMMAND]` builds, and the method it parses with (parse_args,
    parse_intermixed_args or parse_known_args), taken at the moment it starts parsing: nothing after that runs.
    None when the module has no main or parses without argparse."""
    main = main_of(module)
    if main is None:
        return None

    def reach(method):
        def stop(self, *args, **kwargs):
            raise _Reached(self, method)
        return stop

    methods = ("parse_args", "parse_intermixed_args", "parse_known_args")
    loggers = [logging.getLogger(name) for name in ("", "recipes", "data_prep", "launch")]
    kept = [(lg, list(lg.handlers), lg.level) for lg in loggers]  # a main may attach handlers before it parses
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: [setattr(lg, "handlers", h) or lg.setLevel(v) for lg, h, v in kept])
        for m in methods:
            stack.enter_context(mock.patch.object(argparse.ArgumentParser, m, reach(m)))
        try:
            main(command.split())  # "bench train": a command of a group
        except _Reached as r:
            return r.parser, r.method
        except (SystemExit, Exception):  # noqa: BLE001 - it failed before parsing: no argparse parser to check against
            return None
    return None


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def unknown_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """--flags (before a bare `--`) that the parser does not know, abbreviations resolved as argparse does."""
    known = [s for s in parser._option_string_actions]
    bad = []
    for a in argv:
        if a == "--":
            break
        if not a.startswith("-") or re.match(r"^-\d", a) or a == "-":
            continue
        flag = a.split("=", 1)[0]
        if flag in known:
            continue
        prefix = [k for k in known if k.startswith("--") and k.startswith(flag)] if flag.startswith("--") else []
        if not (parser.allow_abbrev and len(prefix) == 1):
            bad.append(flag)
    return bad


def parse_error(parser: argparse.ArgumentParser, method: str, argv: list[str]) -> str | None:
    """argparse's own error for argv (None when it parses)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            getattr(parser, method)(argv)
        except SystemExit as e:
            if e.code:
                return err.getvalue().strip().splitlines()[-1]
    return None


@functools.cache
def help_text(script: str) -> str:
    """What `bash SCRIPT --help` prints (stdout and stderr): the launcher shims list their options there."""
    r = subprocess.run(["bash", str(REPO / script), "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    return r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Recipe overrides
# ---------------------------------------------------------------------------------------------------------------------

def override_problem(key: str) -> str | None:
    """None when `key` (e.g. checkpoint.save_interval) names a field of the recipe schema."""
    from pydantic import BaseModel

    from recipes.config.schema import Recipe

    model: typing.Any = Recipe
    for depth, part in enumerate(key.split(".")):
        if model is None:  # below a dict / list / scalar field: the schema does not name keys there
            return None
        fields = model.model_fields
        if part not in fields:
            return f"override {key}: no field '{part}' in {'.'.join(key.split('.')[:depth]) or 'the recipe'} " \
                   f"(fields: {', '.join(sorted(fields))})"
        inner = [t for t in (typing.get_args(fields[part].annotation) or (fields[part].annotation,))
                 if isinstance(t, type) and issubclass(t, BaseModel)]
        model = inner[0] if inner else None
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Checking one command
# ---------------------------------------------------------------------------------------------------------------------

def problems(cmd: Command) -> list[str]:
    prog = program_of(cmd.words)
    if prog is None:
        return []
    kind, name, argv = prog
    if kind == "retired":
        return [f"there is no `{name}` command: {RETIRED[name]}"]
    return torchrun_problems(cmd.words) + (module_problems(cmd, name, argv) if kind == "module"
                                           else script_problems(cmd, name, argv))


def torchrun_problems(words: list[str]) -> list[str]:
    """torchrun's own options (before `-m`), against torch's own parser."""
    w = [x for x in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", x)]
    if not w or w[0] != "torchrun":
        return []
    from torch.distributed.run import get_args_parser

    own = w[1:w.index("-m")] if "-m" in w else w[1:]
    return [f"unrecognized arguments: torchrun has no option {f}" for f in unknown_flags(get_args_parser(), own)]


def module_problems(cmd: Command, module: str, argv: list[str]) -> list[str]:
    if module == "recipes":
        return recipes_problems(cmd, argv)
    if module == "data_prep":
        return data_prep_problems(cmd, argv)
    if module == "launch" and argv[:1] and argv[0] in ("train", "preflight", "stop", "prep"):
        return script_problems(cmd, f"launch/{argv[0]}.sh", argv[1:])
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        found = None
    if found is None:
        return [f"No module named '{module}'"]
    if not module.startswith(OWN):  # pytest, torch.distributed.run...: theirs to document
        return [p for p in value_problems(argv) if "preset" not in p]
    parsed = parser_of(module)
    if parsed is None:  # no argparse main: the flags must at least appear in its source
        source = Path(found.origin).read_text()
        return [f"python -m {module} has no option {f} (not in {found.origin})"
                for f in flags_of(argv) if not re.search(re.escape(f) + r"\b", source)]
    return [f"unrecognized arguments: python -m {module} has no option {f}" for f in unknown_flags(parsed[0], argv)]


def flags_of(argv: list[str]) -> list[str]:
    own = argv[:argv.index("--")] if "--" in argv else argv
    return [a.split("=")[0] for a in own if a.startswith("-") and a != "-" and not PLACEHOLDER.search(a)]


def recipes_problems(cmd: Command, argv: list[str]) -> list[str]:
    from recipes.__main__ import COMMANDS

    if not argv or argv[0] in ("-h", "--help", "-V", "--version") or PLACEHOLDER.search(argv[0]):
        return []
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        return [f"invalid choice: recipes has no command '{name}' (commands: {', '.join(COMMANDS)})"]
    if name == "bench":  # the benchmarks' group: `bench NAME ...`
        from recipes.tools.bench import BENCHMARKS

        if not rest or rest[0] in ("-h", "--help"):
            return []
        if rest[0] not in BENCHMARKS:
            return [f"invalid choice: recipes bench has no benchmark '{rest[0]}' (benchmarks: {', '.join(BENCHMARKS)})"]
        name, rest = f"bench {rest[0]}", rest[1:]
    parser, method = parser_of("recipes", name)
    out = [f"no preset {a} (configs/{a}.yaml does not exist)" for i, a in enumerate(rest)
           if PRESET.match(a) and not (i and rest[i - 1] in OUTPUT_FLAGS) and a not in produced_paths()
           and not any((REPO / "configs" / f"{a}{x}").is_file() for x in (".yaml", ".yml"))]
    out += [f"unrecognized arguments: python -m recipes {name} has no option {f}" for f in unknown_flags(parser, rest)]
    out += value_problems(rest)
    if not out and not cmd.inline and not has_placeholder(rest):
        err = parse_error(parser, method, rest)
        out += [err] if err else []
    return out


def data_prep_problems(cmd: Command, argv: list[str]) -> list[str]:
    if not argv or argv[0] in ("-h", "--help", "-V", "--version") or PLACEHOLDER.search(argv[0]):
        return []
    top, _ = parser_of("data_prep", "")
    sub = subparser(top, argv[0])
    if sub is None:
        return [f"invalid choice: data_prep has no command '{argv[0]}' "
                f"(commands: {', '.join(subparser_names(top))})"]
    rest = argv[1:]
    out = [f"unrecognized arguments: python -m data_prep {argv[0]} has no option {f}"
           for f in unknown_flags(sub, rest)]
    out += value_problems(rest)
    if argv[0] in ("slurm", "probe") and "--" in rest:
        out += tokenize_tail_problems(cmd, rest[rest.index("--") + 1:])
        rest = rest[:rest.index("--")] + (["--", "x"] if argv[0] == "slurm" else [])
    if not out and not cmd.inline and not has_placeholder(rest):
        err = parse_error(top, "parse_args", [argv[0], *rest])
        out += [err] if err else []
    return out


def subparser_names(parser: argparse.ArgumentParser) -> list[str]:
    return [n for a in parser._actions if isinstance(a, argparse._SubParsersAction) for n in a.choices]


def tokenize_tail_problems(cmd: Command, tail: list[str]) -> list[str]:
    """`-- [tokenize|curate] ARGS` of data_prep slurm / probe and launch/prep.sh: the data_prep command they run."""
    if tail[:1] in (["tokenize"], ["curate"]):
        return data_prep_problems(cmd, tail)
    return data_prep_problems(cmd, ["tokenize", *tail])


def value_problems(argv: list[str]) -> list[str]:
    """Overrides name schema fields; presets and repo paths given as inputs exist."""
    out = []
    for i, a in enumerate(argv):
        m = OVERRIDE.match(a)
        if m:
            out += [p for p in [override_problem(m.group(1))] if p]
        elif i and argv[i - 1] in OUTPUT_FLAGS:
            continue
        elif a.startswith(REPO_DIRS) and not PLACEHOLDER.search(a) and "*" not in a and path_problem(a):
            out.append(path_problem(a))
    return out


def path_problem(path: str) -> str | None:
    """None when `path` (maybe `tests/x.py::test_name`) exists in the repository or a documented command writes it."""
    file, _, test = path.partition("::")
    if file in produced_paths():
        return None
    if not (REPO / file).exists():
        return f"no such file {file} in the repository"
    if test and not re.search(rf"^\s*(?:async )?def {re.escape(test.split('[')[0])}\(", (REPO / file).read_text(),
                              re.M):
        return f"no test {test} in {file}"
    return None


@functools.cache
def produced_paths() -> frozenset[str]:
    """What the documented commands themselves write (`--write-recipe configs/runs/my-70b.yaml`, `-o out/x`), so that
    a later command may read it."""
    out = set()
    for cmd in all_commands():
        out.update(b for a, b in zip(cmd.words, cmd.words[1:]) if a in OUTPUT_FLAGS)
        out.update(w.split("=", 1)[1] for w in cmd.words if w.startswith(PRODUCING_OVERRIDES))
    return frozenset(out)


def script_problems(cmd: Command, script: str, argv: list[str]) -> list[str]:
    if PLACEHOLDER.search(script):
        return []
    if not (REPO / script).is_file():
        return [f"no such script {script}"]
    own = argv[:argv.index("--")] if "--" in argv else argv
    flags = flags_of(argv)
    known = help_text(script) if script in SHIMS else (REPO / script).read_text()
    out = [f"unrecognized option {f}: not an option of {script} (not in its "
           f"{'--help' if script in SHIMS else 'source'})" for f in flags if not re.search(re.escape(f) + r"\b", known)]
    out += value_problems(own)
    if script in SHIMS and "--backend" in own[:-1] and not PLACEHOLDER.search(own[own.index("--backend") + 1]):
        backend = own[own.index("--backend") + 1]
        line = next((x for x in known.splitlines() if x.strip().startswith("--backend")), "")
        choices = [part.split()[0] for part in line.split("NAME", 1)[-1].split("|") if part.split()]
        if backend not in choices:
            out.append(f"invalid choice: --backend {backend} (choose from {', '.join(choices)}: {script} --help)")
    tail = argv[argv.index("--") + 1:] if "--" in argv else []
    if script == "launch/prep.sh" and tail:
        out += tokenize_tail_problems(cmd, tail)
    elif script in ("launch/train.sh", "launch/preflight.sh"):
        out += value_problems(tail)
    elif tail and program_of(tail):  # a wrapper (e.g. tests/support/loopback_ssh.py -- COMMAND)
        out += problems(Command(cmd.where, cmd.text, tail, cmd.inline))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Dotted names in prose (`recipes.planner.validation.validate_for_launch`): moved modules leave these behind
# ---------------------------------------------------------------------------------------------------------------------

def code_span_names(docs: list[Path] = DOCS) -> list[tuple[str, str]]:
    out = []
    for path in docs:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"`((?:recipes|data_prep|launch)(?:\.[A-Za-z_]\w*)+)(?:\(\))?`", line):
                out.append((f"{_rel(path)}:{n}", m.group(1)))
    return out


def _defines(tree: ast.AST, name: str) -> ast.AST | None:
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return node
    return None


def name_problem(dotted: str) -> str | None:
    """None when the longest module prefix of `dotted` is a file of this repository and the rest is defined in it
    (read from its source, nothing imported)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if source.is_file() or base.is_dir():
            node: ast.AST | None = ast.parse(source.read_text()) if source.is_file() else None
            for depth, attr in enumerate(parts[i:]):
                node = _defines(node, attr) if node is not None else None
                if node is None:
                    return f"{'.'.join(parts[:i + depth])} has no `{attr}` (moved or renamed?)"
            return None
    return f"no module {parts[0]}"

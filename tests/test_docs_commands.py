"""Docs cannot go stale (issue 22 item 6): every command README.md and docs/*.md show names a module, command, flag,
recipe field and file that exist, checked against the real parsers (tests/support/doc_commands.py says how); a few
cheap ones run for real. A failure names the file:line, the command as shown, and why it is stale."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import doc_commands as dc
from tests.support import rank_forks



def _report(found: list[tuple[str, str]]) -> str:
    return "stale documentation (fix the docs, or the command if the docs are right):\n" + "\n".join(
        f"  {where}\n      -> {why}" for where, why in found)


@pytest.mark.unit
@pytest.mark.parametrize("doc", dc.DOCS, ids=lambda p: str(p.relative_to(dc.REPO)))
def test_every_documented_command_exists_with_its_flags(doc):
    commands = dc.all_commands([doc])
    found = [(str(c), why) for c in commands for why in dc.problems(c)]
    assert not found, _report(found)


@pytest.mark.unit
def test_every_repository_path_the_docs_name_exists():
    found = [(where, dc.path_problem(path)) for where, path in dc.code_span_paths() if dc.path_problem(path)]
    assert not found, _report(found)


@pytest.mark.unit
def test_the_check_finds_planted_stale_commands(tmp_path):
    """The checker itself can fail: each planted line below is stale in one way, and is reported with that reason;
    the fresh lines are not."""
    doc = tmp_path / "planted.md"
    doc.write_text("\n".join([
        "```bash",
        ".venv/bin/python -m recipes plan configs/examples/c-llama-7b-one-node.yaml --top 3",  # 2: fresh
        ".venv/bin/python -m recipes plann configs/examples/c-llama-7b-one-node.yaml",  # 3
        ".venv/bin/python -m recipes plan configs/examples/c-llama-7b-one-node.yaml --topp 3 --nodes 2",  # 4
        ".venv/bin/python -m data_prep tokenize data/ -o out -t tok.model --executor spark",  # 5
        ".venv/bin/python -m data_prep tokenise data/ -o out -t tok.model",  # 6
        ".venv/bin/python -m recipes.plan models/llama-70b",  # 7
        "launch/train.sh configs/runs/tiny-cpu.yaml --hostfile hosts --max-restart 3 --backend pdsh",  # 8
        "launch/prep.sh --hostfile hosts -- data/ -o out -t tok.model --shard-sise 1G",  # 9
        "launch/submit.sh configs/runs/tiny-cpu.yaml",  # 10
        ".venv/bin/python -m recipes train --config configs/runs/tiny-cpu.yaml --local 2 checkpoint.save_every=5",  # 11
        ".venv/bin/python -m recipes render configs/runs/no-such-run.yaml --out /tmp/r --layout-only",  # 12
        ".venv/bin/python -m recipes plan models/llama-71b",  # 13
        ".venv/bin/python -m data_prep slurm --tasks 4 -- curate data/ -o out --stepz s.yaml",  # 14
        ".venv/bin/python -m recipes render configs/runs/tiny-cpu.yaml --layout-only",  # 15: --out is required
        "torchrun --nproc-per-node 8 --nodes 2 -m recipes train --config configs/runs/tiny-cpu.yaml",  # 16
        "```",
        "Prose: `launch/stop.sh RUN_DIR`, `launch/train.sh --backend torchrun-ssh` and `data_prep verify` are fresh; `pretrain --local 8` is not, nor is",  # 18
        "`python -m recipes export-hf --checkpoint CKPT --to-hf DIR`, nor `recipes/safe_load.py`.",  # 19
    ]))
    found = {(c.where.rsplit(":", 1)[1], why) for c in dc.all_commands([doc]) for why in dc.problems(c)}
    lines = {line for line, _ in found}
    assert lines == {str(n) for n in range(3, 17)} | {"18", "19"}, found
    why = {line: " / ".join(sorted(w for n, w in found if n == line)) for line in lines}
    assert "invalid choice: recipes has no command 'plann'" in why["3"]
    assert "python -m recipes plan has no option --topp" in why["4"]
    assert "invalid choice: 'spark'" in why["5"]
    assert "data_prep has no command 'tokenise'" in why["6"]
    assert "No module named 'recipes.plan'" in why["7"]
    assert "--max-restart: not an option of launch/train.sh (not in its --help)" in why["8"]
    assert "invalid choice: --backend pdsh" in why["8"]
    assert "python -m data_prep tokenize has no option --shard-sise" in why["9"]
    assert "no such script launch/submit.sh" in why["10"]
    assert "override checkpoint.save_every: no field 'save_every' in checkpoint" in why["11"]
    assert "save_interval" in why["11"]  # the fields it has, listed
    assert "no such file configs/runs/no-such-run.yaml" in why["12"]
    assert "no preset models/llama-71b" in why["13"]
    assert "python -m data_prep curate has no option --stepz" in why["14"]
    assert "the following arguments are required: --out" in why["15"]
    assert "torchrun has no option --nodes" in why["16"]
    assert "there is no `pretrain` command" in why["18"]
    assert "python -m recipes export-hf has no option --to-hf" in why["19"]
    paths = dc.code_span_paths([doc])
    assert [(w, dc.path_problem(p)) for w, p in paths if dc.path_problem(p)] == [
        (f"{doc}:19", "no such file recipes/safe_load.py in the repository")]


def _documented(prefix: list[str]) -> list[dc.Command]:
    """Block commands (no placeholders) of `python -m recipes PREFIX...` (inline ones are often fragments)."""
    out = []
    for c in dc.all_commands():
        prog = dc.program_of(c.words)
        if not c.inline and prog and prog[:2] == ("module", "recipes") and prog[2][:len(prefix)] == prefix \
                and not dc.has_placeholder(prog[2]):
            out.append(c)
    return out


def _shown_error(c: dc.Command) -> str | None:
    """The `error: ...` line a doc shows right under a `$ command` line, if it does."""
    file, line = c.where.rsplit(":", 1)
    lines = (dc.REPO / file).read_text().splitlines()
    after = lines[int(line)] if int(line) < len(lines) else ""
    return after if after.startswith("error:") else None


@pytest.mark.unit
@pytest.mark.parametrize("prefix", [["plan"], ["render"]], ids=["plan", "render"])
def test_cheap_documented_commands_run(prefix, tmp_path):
    """The planner and render commands as the docs show them (only the planner and the YAML loader run;
    outputs go under tmp_path; a render that needs data is given --layout-only, as the docs say for that case)."""
    from recipes.__main__ import main

    commands = _documented(prefix)
    assert commands, prefix
    for i, c in enumerate(commands):
        argv = list(dc.program_of(c.words)[2])
        for flag in ("--out", "--write-recipe"):
            if flag in argv:
                argv[argv.index(flag) + 1] = str(tmp_path / f"{i}{flag}")
        if "--write-recipe" in argv or any(a in dc.produced_paths() for a in argv):
            continue  # needs a file an earlier documented step writes: checked by name above, not run here
        if argv[0] == "render" and "--layout-only" not in argv:
            argv.append("--layout-only")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        shown = _shown_error(c)
        if shown:  # the doc shows this command failing: it must fail with that error
            assert rc == 2 and err.getvalue().startswith(shown[:60]), f"{c}\n    -> the doc shows `{shown[:100]}`, " \
                f"the command exits {rc}: {err.getvalue()[-2000:]}"
            continue
        assert rc == 0, f"{c}\n    -> exit {rc}: {err.getvalue()[-2000:]}"
        if argv[0] == "render":
            assert (Path(argv[argv.index("--out") + 1]) / "ds_config.json").is_file(), c


@pytest.mark.unit
def test_every_module_and_function_the_docs_name_exists(tmp_path):
    names = dc.code_span_names()
    assert names  # the docs do name modules: the search finds them
    found = [(where, dc.name_problem(name)) for where, name in names if dc.name_problem(name)]
    assert not found, _report(found)
    planted = tmp_path / "planted.md"
    planted.write_text("`recipes.planner.validation.validate_for_launch` `recipes.train.trainer.run_everything` "
                       "`recipes.safe_load` `data_prep.write.shards.ShardWriter`\n")
    assert [(w.rsplit(":", 1)[1], dc.name_problem(n)) for w, n in dc.code_span_names([planted])
            if dc.name_problem(n)] == [("1", "recipes.train.trainer has no `run_everything` (moved or renamed?)"),
                                       ("1", "recipes has no `safe_load` (moved or renamed?)")]


QUICKSTART = dc.REPO / "docs" / "quickstart.md"


def quickstart_lines() -> list[tuple[str, str]]:
    """(file:line, command line) of docs/quickstart.md's blocks, in order (a line's `&&` parts run as one line)."""
    seen: dict[str, str] = {}
    for c in dc.block_commands(QUICKSTART):
        seen.setdefault(c.where, c.text)
    return list(seen.items())


@pytest.mark.multiproc
def test_the_quickstart_runs_as_written_in_order(tmp_path):
    """docs/quickstart.md end to end: every command as written, in order, each one's inputs only what the earlier
    ones wrote (not each command alone: a placeholder, an output that exists already or a continuation with nothing
    left to train fails here). It runs from a directory that shows the repository's configs/ and .venv/ where the
    repository root does, so the outputs land in tmp_path; its .venv is the forking one (tests/support/rank_forks.py:
    each `.venv/bin/python -m recipes|data_prep` forked from a pre-imported template, the same command otherwise)."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "configs").symlink_to(dc.REPO / "configs")
    (root / ".venv").symlink_to(rank_forks.venv())
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    lines = quickstart_lines()
    assert len(lines) >= 9, lines
    for where, text in lines:
        r = subprocess.run(["bash", "-c", text], cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{where}: `{text}` exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        assert "Traceback" not in r.stderr, f"{where}: `{text}`\n{r.stderr[-4000:]}"
    for left in ("out/demo/shards/manifest.json", "runs/tiny/global_step6/complete.json", "runs/tiny-hf/config.json",
                 "runs/cont/global_step6/complete.json", "runs/tiny-2x1x4/global_step12/complete.json"):
        assert (root / left).is_file(), f"the quickstart did not leave {left}"

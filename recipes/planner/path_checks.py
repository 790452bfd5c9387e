"""Paths of the wrong kind in a recipe, refused before any rank starts: a directory setting that names a file (every
rank would fail to create it after the slow start-up, with a traceback), evaluation inputs that are missing or of the
wrong kind (found only at the first evaluation, hours in). Relative paths are judged from the working directory,
which is the repository where the ranks run (the launcher checks from there)."""
from __future__ import annotations

from pathlib import Path

from recipes.config.problem import Problem


def path_problems(recipe) -> list[Problem]:
    out: list[Problem] = []
    dirs = (("checkpoint.dir", recipe.checkpoint.dir), ("logging.dir", recipe.logging.dir),
            ("data.cache_dir", recipe.data.cache_dir))
    for field, value in dirs:
        if value and "://" not in value and Path(value).exists() and not Path(value).is_dir():
            out.append(Problem(field, f"{field} = {value} is a file, not a directory",
                               f"give {field} a directory (it is created when missing), or move the file away"))
    ev = recipe.evaluation
    if ev.interval is None:
        return out
    if ev.include_path and not Path(ev.include_path).is_dir():
        what = "is a file" if Path(ev.include_path).exists() else "does not exist"
        out.append(Problem("evaluation.include_path", f"evaluation.include_path = {ev.include_path} {what}",
                           "give the directory holding your lm-eval task YAMLs, or remove evaluation.include_path"))
    if ev.text and not Path(ev.text).is_file():
        what = "is a directory" if Path(ev.text).is_dir() else "does not exist"
        out.append(Problem("evaluation.text", f"evaluation.text = {ev.text} {what}",
                           "give a .jsonl or .txt file of text to measure perplexity on, or remove evaluation.text "
                           "(the shipped sample is used)"))
    return out

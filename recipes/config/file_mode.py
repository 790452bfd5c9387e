"""checkpoint.file_mode applied: the mode of everything a run (or a reshape, an export, the launcher) writes. The
mechanics (umask, our writers' mode, the tree fix before a checkpoint is marked complete) are data_prep.file_modes,
shared with data_prep's --file-mode."""
from __future__ import annotations

from typing import Optional

from data_prep.file_modes import ENV, apply, current, dir_mode, fix_dir_files, fix_tree  # noqa: F401  (the API)
from data_prep.file_modes import parse  # noqa: F401  (also the API: launch/prep.py checks data_prep's --file-mode)


def recipe_mode(recipe) -> Optional[int]:
    """The recipe's checkpoint.file_mode as a number; None = today's modes."""
    text = recipe.checkpoint.file_mode
    return None if text is None else parse(text, "checkpoint.file_mode")


def apply_recipe_mode(recipe) -> Optional[int]:
    """Make the recipe's mode this process's (and its children's) from now on; returns it."""
    mode = recipe_mode(recipe)
    apply(mode)
    return mode

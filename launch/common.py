"""What every launch module shares: where the repository, its venv and Python are, the error that carries an exit
code, and the `[launch] ...` line on stderr."""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

LAUNCH_DIR = Path(__file__).resolve().parent
REPO_DIR = LAUNCH_DIR.parent
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

log = logging.getLogger("launch")


class LaunchError(Exception):
    """A problem the user can fix; `code` is the command's exit status (2 arguments, 3 layout, 4 nodes, 5 lease)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Interrupted(Exception):
    """Ctrl-C, kill or a closed terminal reached the launcher (SIGINT, SIGTERM, SIGHUP)."""


def venv_dir() -> str:
    """LAUNCH_VENV, else the repository's .venv; symlinks kept as given (the ranks run the path the user chose)."""
    return os.path.abspath(os.environ.get("LAUNCH_VENV") or REPO_DIR / ".venv")


def python() -> str:
    return os.path.join(venv_dir(), "bin", "python")


def say(message: str) -> None:
    log.info(message)


def setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[launch] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def remote_launch(*args: str) -> str:
    """A shell line that runs `python -m launch ARGS` from this checkout on a node (same paths on every node):
    `python -m` puts the working directory, the repository, first on the import path."""
    import shlex

    return f"cd {shlex.quote(str(REPO_DIR))} && exec {shlex.quote(python())} -m launch " + " ".join(
        shlex.quote(a) for a in args)

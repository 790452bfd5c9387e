"""Logging for every recipes command: one stderr handler, messages as written (they are for people, and each names
what it is about), and a rank filter: under a launcher only rank 0 speaks, except warnings and errors (a problem on
rank 5 must be seen) and records logged with `extra={"all_ranks": True}`.

Libraries log through `logging.getLogger(__name__)`; entry points call `setup_logging()` once. Command output that
users read (plans, tables, the training progress lines) stays on stdout, not in the log. Library lines that every
process prints and nobody can act on are dropped at their logger (`drop_library_noise`), each with its reason.
"""
from __future__ import annotations

import logging
import os
import sys


class RankZeroFilter(logging.Filter):
    """Pass records of rank 0 (RANK unset = a single process), and warnings or `all_ranks` records of every rank."""

    def filter(self, record: logging.LogRecord) -> bool:
        return (os.environ.get("RANK", "0") == "0" or record.levelno >= logging.WARNING
                or bool(getattr(record, "all_ranks", False)))


# logger name -> the start of the message dropped; the reason beside each
LIBRARY_NOISE = {
    # DeepSpeed picks its accelerator when first imported and, finding no GPU, warns in every process that imports
    # it: each rank, each checkpoint writer, each evaluation, export and reshape. On CPU that is the recipe's choice
    # (cluster.device: cpu, --local), not news. The case it would flag, a GPU recipe where torch sees no GPU, is
    # reported once by the train command instead (recipes.train.cli, "torch sees no GPU").
    "DeepSpeed": "Setting accelerator to CPU",
}


class _DropMessages(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def drop_library_noise() -> None:
    """Filter LIBRARY_NOISE at the libraries' own loggers (idempotent). Works before the library is imported: a logger
    is created by name, and DeepSpeed's LoggerFactory adds its handler to the same object, filter included. Called
    when the `recipes` package is imported (recipes/__init__.py), before anything imports DeepSpeed."""
    for name, prefix in LIBRARY_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropMessages(prefix))


def setup_logging(quiet: bool = False) -> logging.Logger:
    """Configure the `recipes` logger (idempotent): INFO, or WARNING when quiet. Returns it."""
    logger = logging.getLogger("recipes")
    if not any(getattr(h, "recipes_handler", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(RankZeroFilter())
        handler.recipes_handler = True
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    return logger

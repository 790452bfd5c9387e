"""Logging for every recipes command: one stderr handler, messages as written (they are for people, and each names
what it is about), and a rank filter: under a launcher only rank 0 speaks, except warnings and errors (a problem on
rank 5 must be seen) and records logged with `extra={"all_ranks": True}`.

Libraries log through `logging.getLogger(__name__)`; entry points call `setup_logging()` once. Command output that
users read (plans, tables, the training progress lines) stays on stdout, not in the log.
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

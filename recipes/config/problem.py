"""The one type of a reason a run cannot start: the recipe field (or file) to change, what is wrong with the values,
and the fix. Layout rules (recipes.parallel.layout), data checks and the relaunch / init_from checks all return it;
the planner's validation formats them together."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}" if self.fix else self.message

"""The removal log: every document a filter or dedup step removed, by reference, with the step and the reason.

Each unit writes ``shard_NNNNNN.removed.jsonl`` (one JSON line per removed document: the input file, its position as
the reject log gives it - byte offset, line or row - the step's name, the reason, and for duplicates the reference of
the kept copy as ``shard_NNNNNN#ordinal``), made visible with the unit's completion marker; the finished run
concatenates them in unit order into ``removed.jsonl``, so the log is the same whatever the number of workers.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional

import orjson

from data_prep import io
from data_prep.write.rejects import RejectLog, concat_unit_logs

REMOVED = "removed.jsonl"


def removals_path(out_dir: str, unit_name: str) -> str:
    return io.join(out_dir, unit_name + ".removed.jsonl")


class RemovalLog(RejectLog):
    """One unit's removals: counted by step and reason, logged to a temporary file opened at the first one."""

    def __init__(self, out_dir: str, unit_name: str):
        super().__init__(out_dir, unit_name)
        self.path = removals_path(out_dir, unit_name)
        self.tmp = self.path + ".tmp"
        self.by_step: Dict[str, Counter] = {}

    def remove(self, file: str, position_kind: str, position: int, step: str, reason: str,
               duplicate_of: Optional[str] = None) -> None:
        self.by_step.setdefault(step, Counter())[reason] += 1
        self.counts[step] += 1
        if self._f is None:
            self._f = io.open_write(self.tmp)
        rec = {"file": file, position_kind: position, "step": step, "reason": reason}
        if duplicate_of is not None:
            rec["duplicate_of"] = duplicate_of
        self._f.write(orjson.dumps(rec) + b"\n")

    def summary(self) -> Dict[str, Dict[str, int]]:
        """{step: {reason: documents}}, sorted, for the unit's stats and the manifest."""
        return {s: dict(sorted(c.items())) for s, c in sorted(self.by_step.items())}


def add_removed(total: Dict[str, Counter], removed: Dict[str, Dict[str, int]]) -> None:
    for step, reasons in removed.items():
        total.setdefault(step, Counter()).update(reasons)


def removed_count(removed: Dict[str, Dict[str, int]]) -> int:
    return sum(sum(r.values()) for r in removed.values())


def merge_removal_logs(out_dir: str, unit_names: List[str], work_dir: str = "") -> None:
    """Concatenate the units' logs, in unit order, into removed.jsonl (as the reject logs are merged)."""
    concat_unit_logs(out_dir, unit_names, removals_path, REMOVED, work_dir)

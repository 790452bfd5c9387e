"""The reject log: every record that did not become a document, with where it was and why.

Each unit writes ``shard_NNNNNN.rejects.jsonl`` (one JSON line per rejected record: the input file, its position
and the reason), made visible with the unit's shard; the finished run concatenates them in unit order into
``rejects.jsonl``, so the log is the same whatever the number of workers.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from typing import List

import orjson

from data_prep import io

REJECTS = "rejects.jsonl"


def rejects_path(out_dir: str, unit_name: str) -> str:
    return io.join(out_dir, unit_name + ".rejects.jsonl")


class RejectLog:
    """One unit's rejects: counted by reason, logged to a temporary file opened at the first reject."""

    def __init__(self, out_dir: str, unit_name: str):
        self.path = rejects_path(out_dir, unit_name)
        self.tmp = self.path + ".tmp"
        self.counts: Counter = Counter()
        self._f = None

    def add(self, file: str, position_kind: str, position: int, reason: str) -> None:
        self.counts[reason] += 1
        if self._f is None:
            self._f = io.open_write(self.tmp)
        self._f.write(orjson.dumps({"file": file, position_kind: position, "reason": reason}) + b"\n")

    def commit(self) -> None:
        """Make the log visible; a unit without rejects removes the log of an earlier run."""
        if self._f is not None:
            io.fsync_file(self._f)
            self._f.close()
            self._f = None  # closed: ``abort`` after a failed rename removes the temporary file only
            io.commit(self.tmp, self.path)
        else:
            io.remove(self.path)

    def abort(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except OSError:  # its buffer cannot be written on a full disk
                pass
            self._f = None
        io.remove(self.tmp)


def merge_reject_logs(out_dir: str, unit_names: List[str], work_dir: str = "") -> None:
    """Concatenate the units' logs, in unit order, into rejects.jsonl."""
    concat_unit_logs(out_dir, unit_names, rejects_path, REJECTS, work_dir)


def concat_unit_logs(out_dir: str, unit_names: List[str], unit_path, final_name: str, work_dir: str = "") -> None:
    """Concatenate per-unit logs (``unit_path(out_dir, name)``), in unit order, into ``final_name`` (written
    atomically; for a URL ``out_dir`` assembled in the local ``work_dir`` and uploaded)."""
    path = io.join(out_dir, final_name)
    local = os.path.join(work_dir or tempfile.gettempdir(), final_name) if io.is_url(out_dir) else path
    tmp = io.tmp_name(local, shared=True)
    with io.open_write(tmp) as out:
        for name in unit_names:
            p = unit_path(out_dir, name)
            if io.exists(p):
                with io.open_read(p) as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        out.write(block)
        io.fsync_file(out)
    io.publish(tmp, path)

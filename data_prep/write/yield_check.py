"""Does a finished run hold documents? A run that wrote none, or rejected more than ``--max-reject-fraction`` of its
records, fails instead of leaving an empty (or mostly empty) manifest behind.

Where the check happens: when manifest.json is about to be written, i.e. once every unit is complete, from the
totals of all units. A unit, a worker or a slice (a Slurm array task, a hostfile node) sees only its share: one file
of the wrong shape in a healthy corpus rejects a whole unit, and a slice can hold nothing but such units, so a check
there would fail good runs. The manifest merge (the last slice to finish, or ``--merge-only``) is the first place
that sees the whole run. Mistakes that are visible up front (a wrong ``--text-field``, a parquet without the column)
are refused before any work by read/probe.py; this is the backstop for what only the whole run shows.

On failure no manifest.json is written (a stale one is removed), the merged rejects.jsonl is, and the units' stats
markers are kept: a rerun with a raised ``--max-reject-fraction`` (not part of the settings fingerprint) reuses every
finished unit, while a changed ``--text-field`` redoes them.
"""

from __future__ import annotations

from collections import Counter
from typing import List, Optional

import orjson

from data_prep import io, objstore
from data_prep.read.diagnose import explain, view_record
from data_prep.write.rejects import REJECTS, rejects_path

VIEW_SCAN_LINES = 100_000  # reject-log lines read to find a record of the top reason (it is the most common one)


class NoUsableOutput(ValueError):
    """The run wrote no documents, or rejected too many records: one line naming the top reason and its fix."""


def check_yield(out_dir: str, stats: List[dict], text_field: str, max_reject_fraction: float = 1.0) -> None:
    """Raise NoUsableOutput when ``stats`` (every unit's) hold no document or reject more than the fraction."""
    records = sum(st["input_records"] for st in stats)
    docs = sum(st["documents"] for st in stats)
    rejected: Counter = Counter()
    for st in stats:
        rejected.update(st["rejected"])
    n_rejected = sum(rejected.values())
    too_many = records > 0 and n_rejected / records > max_reject_fraction
    if docs > 0 and not too_many:
        return
    where = objstore.redact(out_dir)
    if docs == 0 and not n_rejected:
        raise NoUsableOutput(_nothing_read(where, records, stats))
    reason, count = rejected.most_common(1)[0]
    view = _view_of_first(out_dir, stats, reason)
    head = (f"no documents written to {where}: all {records:,} records were rejected" if docs == 0 and
            n_rejected == records else
            f"no documents written to {where}: {n_rejected:,} of {records:,} records were rejected" if docs == 0 else
            f"{n_rejected:,} of {records:,} records ({n_rejected / records:.1%}) were rejected, more than "
            f"--max-reject-fraction {max_reject_fraction:g}")
    others = ", ".join(f"{r} {n:,}" for r, n in rejected.most_common()[1:4])
    raise NoUsableOutput(
        f"{head}, most as {reason} ({count:,}{'; then ' + others if others else ''}): "
        f"{explain(reason, text_field, view)}. No manifest.json was written; {REJECTS} in the output lists every "
        f"rejected record and why" + ("" if docs == 0 else "; to accept these rejects, rerun with a higher "
                                                          "--max-reject-fraction (finished units are reused)"))


def _nothing_read(where: str, records: int, stats: List[dict]) -> str:
    """No document and no reject: the inputs were empty, or curation steps removed everything."""
    removed: Counter = Counter()
    for st in stats:
        for step, reasons in st.get("removed", {}).items():
            for why, n in reasons.items():
                removed[f"{step}: {why}"] += n
    if removed:
        top = ", ".join(f"{k} {n:,}" for k, n in removed.most_common(3))
        return (f"no documents written to {where}: the curation steps removed all {records:,} records ({top}); "
                f"loosen the thresholds of the step list (--steps) or check it is meant for this corpus")
    files = len({p["path"] for st in stats for p in st.get("inputs", [])})
    return (f"no documents written to {where}: the inputs hold no records ({files} input file(s), empty or blank "
            f"lines only); check the input paths, and that .jsonl files hold one JSON object per line")


def _view_of_first(out_dir: str, stats: List[dict], reason: str):
    """What the first record rejected for ``reason`` holds (from its unit's reject log), or None."""
    for st in stats:
        if not st["rejected"].get(reason):
            continue
        kinds = {p["path"]: p["kind"] for p in st.get("inputs", [])}
        entry = _first_entry(rejects_path(out_dir, st["unit"]) if "unit" in st else "", reason)
        if entry is None:
            return None
        position = next((v for k, v in entry.items() if k not in ("file", "reason")), 0)
        return view_record(entry["file"], kinds.get(entry["file"], "jsonl"), int(position))
    return None


def _first_entry(log_path: str, reason: str) -> Optional[dict]:
    if not log_path:
        return None
    try:
        with io.open_read(log_path) as f:
            for i, line in enumerate(f):
                if i >= VIEW_SCAN_LINES:
                    return None
                entry = orjson.loads(line)
                if entry.get("reason") == reason:
                    return entry
    except (OSError, ValueError):
        return None
    return None

"""Probe the inputs before any work: can they be read, and does the text field hold documents?

A wrong ``--text-field``, a parquet file without the column or a jsonl of the wrong shape would otherwise be found
record by record, after every unit ran (on a Slurm array: after the allocation is spent), and end in an empty
manifest. So before planning, the first input of each kind (in listing order: at most one .jsonl, one .jsonl.gz, one
.jsonl.zst, one parquet, one dataset, one .txt) is probed, at a constant cost whatever the corpus size:

- parquet / saved dataset: the schema (the parquet footer: ranged GETs on object storage) must have the text
  column, of a string type;
- jsonl (plain or compressed): the first ``PROBE_RECORDS`` records (at most ``PROBE_BYTES`` of a plain file); if
  none is usable and they fail for a reason of the file's shape (no such field, not text, not JSON objects, not
  UTF-8), the run is refused. Empty documents are not refused here: a file may start with a few;
- .txt: a few bytes are read (the credentials and permissions).

A refusal is a ``ProbeError`` (a ValueError: the CLI exits 2) naming the input, what its records hold and the fix.
The other inputs are not read here: what they reject is counted by the run, and a run that writes nothing (or
rejects more than ``--max-reject-fraction``) fails at its end (write/yield_check.py).
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Iterable, List

from data_prep import io, objstore
from data_prep.read import formats as fm
from data_prep.read.diagnose import dataset_columns, explain, parquet_columns, schema_view, view_record
from data_prep.settings import DEFAULT_MAX_RECORD

PROBE_RECORDS = 100
PROBE_BYTES = 1 << 20
# Reasons that, when every probed record has one, say the file (or the flag) is wrong, not a few records.
SHAPE_REASONS = (fm.MISSING_TEXT, fm.NON_STRING_TEXT, fm.NOT_AN_OBJECT, fm.MALFORMED_JSON, fm.INVALID_UTF8)


class ProbeError(ValueError):
    """An input whose records cannot give documents with these settings (one line: the input, why, the fix)."""


def first_of_each_kind(pieces: Iterable[fm.Piece]) -> List[fm.Piece]:
    seen, out = set(), []
    for p in pieces:
        if p.kind not in seen:
            seen.add(p.kind)
            out.append(p)
    return out


def probe_inputs(pieces: Iterable[fm.Piece], text_field: str, max_record: int = DEFAULT_MAX_RECORD) -> List[str]:
    """Probe the first input of each kind; raises ProbeError or StorageAccessError. Returns one line per input
    probed, for a report (``data_prep probe``)."""
    report = []
    for piece in first_of_each_kind(pieces):
        if piece.kind in ("parquet", "hf"):
            report.append(_probe_schema(piece, text_field))
        elif piece.kind.startswith("jsonl"):
            report.append(_probe_records(piece, text_field, max_record))
        else:
            with io.open_read(piece.path) as f:  # .txt: one document per file; the read proves access
                f.read(64)
            report.append(f"{objstore.redact(piece.path)}: readable (.txt: one document per file)")
    return report


def _is_text_type(arrow_or_feature_type: str) -> bool:
    t = arrow_or_feature_type
    return t in ("string", "large_string", "string_view") or t.startswith("dictionary<values=string")


def _probe_schema(piece: fm.Piece, text_field: str) -> str:
    try:
        columns = parquet_columns(piece.path) if piece.kind == "parquet" else dataset_columns(piece.path)
    except objstore.StorageAccessError:
        raise
    except Exception:  # a corrupt file is the run's to report (it fails its unit alone)
        return f"{objstore.redact(piece.path)}: unreadable schema (its unit will fail and say why)"
    view = schema_view(piece.path, columns)
    where = objstore.redact(piece.path)
    if text_field not in columns:
        raise ProbeError(f"input {where}: {explain(fm.MISSING_TEXT, text_field, view)}")
    if not _is_text_type(columns[text_field]):
        raise ProbeError(f"input {where}: {explain(fm.NON_STRING_TEXT, text_field, view)}")
    return f"{where}: column {text_field!r} is {columns[text_field]}"


def _probe_records(piece: fm.Piece, text_field: str, max_record: int) -> str:
    if piece.kind == "jsonl":  # a plain file: its first PROBE_BYTES (the last line read whole)
        piece = fm.Piece(piece.path, piece.kind, 0, min(io.size(piece.path), PROBE_BYTES))
    reasons: Counter = Counter()
    first_at = {}
    good = 0
    records = fm.read_piece(piece, text_field, max_record)
    try:
        for pos, text, reason in itertools.islice(records, PROBE_RECORDS):
            if text is not None:
                good += 1
                break  # one usable document is enough: the field exists and holds text
            reasons[reason] += 1
            first_at.setdefault(reason, pos)
    except fm.InputError:  # truncated or corrupt: the run fails that unit alone and says why
        return f"{objstore.redact(piece.path)}: unreadable (its unit will fail and say why)"
    finally:
        records.close()
    where = objstore.redact(piece.path)
    if good or not reasons:
        return f"{where}: field {text_field!r} holds text" if good else f"{where}: no records"
    reason, n = reasons.most_common(1)[0]
    if reason not in SHAPE_REASONS:
        return f"{where}: the first {n} record(s) are rejected ({reason}); the run counts the rest"
    view = view_record(piece.path, piece.kind, first_at[reason])
    raise ProbeError(f"input {where}: its first {sum(reasons.values())} record(s) are all rejected, most as "
                     f"{reason}: {explain(reason, text_field, view)}")


"""Probe the inputs before any work: can they be read, and does the text field hold documents?

A wrong ``--text-field``, a parquet file without the column or a jsonl of the wrong shape would otherwise be found
record by record, after every unit ran (on a Slurm array: after the allocation is spent), and end in an empty
manifest. So before planning, the first inputs of each kind (in listing order: .jsonl, .jsonl.gz, .jsonl.zst,
parquet, saved dataset, .txt) are probed, at a constant cost whatever the corpus size:

- parquet / saved dataset: the schema (the parquet footer: ranged GETs on object storage) must have the text
  column, of a string type;
- jsonl (plain or compressed): the first ``PROBE_RECORDS`` records (at most ``PROBE_BYTES`` of a plain file) must
  give a document; when none does, and they fail for a reason of the file's shape (no such field, not text, not JSON
  objects, not UTF-8), the input is refused. Empty documents are not refused here: a file may start with a few;
- .txt: a few bytes are read (the credentials and permissions).

One odd file must not stop a good corpus (a stray metadata .json in a directory, one parquet of another schema): for
each kind, inputs are probed in order until one gives a document, up to ``PROBE_FILES`` of them, and the run is
refused only when none did and at least one was refused. A refusal is a ``ProbeError`` (a ValueError: the CLI exits
2) naming the input, what its records hold and the fix. What the other inputs reject is counted by the run, and a run
that writes nothing (or rejects more than ``--max-reject-fraction``) fails at its end (write/yield_check.py).
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Dict, Iterable, List, Tuple

from data_prep import io, objstore
from data_prep.read import formats as fm
from data_prep.read.diagnose import dataset_columns, explain, parquet_columns, schema_view, view_record
from data_prep.settings import DEFAULT_MAX_RECORD

PROBE_RECORDS = 100
PROBE_BYTES = 1 << 20
PROBE_FILES = 8  # inputs of one kind probed, at most, for one that gives a document
# Reasons that, when every probed record has one, say the file (or the flag) is wrong, not a few records.
SHAPE_REASONS = (fm.MISSING_TEXT, fm.NON_STRING_TEXT, fm.NOT_AN_OBJECT, fm.MALFORMED_JSON, fm.INVALID_UTF8)


class ProbeError(ValueError):
    """An input whose records cannot give documents with these settings (one line: the input, why, the fix)."""


def by_kind(pieces: Iterable[fm.Piece], per_kind: int = PROBE_FILES) -> Dict[str, List[fm.Piece]]:
    """The first ``per_kind`` inputs of each kind, in listing order."""
    out: Dict[str, List[fm.Piece]] = {}
    for p in pieces:
        group = out.setdefault(p.kind, [])
        if len(group) < per_kind:
            group.append(p)
    return out


def probe_inputs(pieces: Iterable[fm.Piece], text_field: str, max_record: int = DEFAULT_MAX_RECORD) -> List[str]:
    """Probe the first inputs of each kind; raises ProbeError or StorageAccessError. Returns one line per input
    probed, for a report (``data_prep probe``)."""
    pieces = list(pieces)
    report = _compressed_formats(pieces)
    for kind, group in by_kind(pieces).items():
        refused: List[ProbeError] = []
        for piece in group:
            try:
                good, line = _probe_one(piece, text_field, max_record)
            except ProbeError as e:
                refused.append(e)
                continue
            report.append(line)
            if good:  # the refused ones before it are odd files: the run counts their rejects
                report += [f"{e} (its records will be rejected; {line.split(': ')[0]} gives documents)"
                           for e in refused]
                break
        else:
            if refused:
                more = f" (as do the other {len(refused) - 1} {kind} input(s) probed)" if len(refused) > 1 else ""
                raise ProbeError(f"{refused[0]}{more}")
    return report


def _compressed_formats(pieces: List[fm.Piece]) -> List[str]:
    """Every local .gz/.zst input starts as its format (a few bytes each; object storage would cost a request per
    object, so there a wrong one fails its unit, saying why): a plain file named .gz is refused before any work."""
    wrong, checked = [], 0
    for p in pieces:
        if not p.kind.startswith("jsonl.") or io.is_url(p.path):
            continue
        checked += 1
        try:
            with open(p.path, "rb") as f:
                why = fm.not_compressed(p.path, p.kind.split(".")[1], f.read(16))
        except OSError:
            continue  # unreadable: the probe or its unit says why
        if why:
            wrong.append(f"input {p.path}: {why}")
    if wrong:
        more = f" (and {len(wrong) - 1} more input(s) like it: {', '.join(w.split(': ')[0][6:] for w in wrong[1:4])}" \
               f"{'...' if len(wrong) > 4 else ''})" if len(wrong) > 1 else ""
        raise ProbeError(wrong[0] + more)
    return [f"{checked} compressed input(s): each starts as its format"] if checked else []


def _probe_one(piece: fm.Piece, text_field: str, max_record: int) -> Tuple[bool, str]:
    """(gives a document, report line), or ProbeError."""
    if piece.kind in ("parquet", "hf"):
        return _probe_schema(piece, text_field)
    if piece.kind.startswith("jsonl"):
        return _probe_records(piece, text_field, max_record)
    with io.open_read(piece.path) as f:  # .txt: one document per file; the read proves access
        f.read(64)
    return True, f"{objstore.redact(piece.path)}: readable (.txt: one document per file)"


def _is_text_type(arrow_or_feature_type: str) -> bool:
    t = arrow_or_feature_type
    return t in ("string", "large_string", "string_view") or t.startswith("dictionary<values=string")


def _probe_schema(piece: fm.Piece, text_field: str) -> Tuple[bool, str]:
    try:
        columns = parquet_columns(piece.path) if piece.kind == "parquet" else dataset_columns(piece.path)
    except objstore.StorageAccessError:
        raise
    except Exception:  # a corrupt file is the run's to report (it fails its unit alone)
        return False, f"{objstore.redact(piece.path)}: unreadable schema (its unit will fail and say why)"
    view = schema_view(piece.path, columns)
    where = objstore.redact(piece.path)
    if text_field not in columns:
        raise ProbeError(f"input {where}: {explain(fm.MISSING_TEXT, text_field, view)}")
    if not _is_text_type(columns[text_field]):
        raise ProbeError(f"input {where}: {explain(fm.NON_STRING_TEXT, text_field, view)}")
    return True, f"{where}: column {text_field!r} is {columns[text_field]}"


def _probe_records(piece: fm.Piece, text_field: str, max_record: int) -> Tuple[bool, str]:
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
        return False, f"{objstore.redact(piece.path)}: unreadable (its unit will fail and say why)"
    finally:
        records.close()
    where = objstore.redact(piece.path)
    if good or not reasons:
        return bool(good), f"{where}: field {text_field!r} holds text" if good else f"{where}: no records"
    reason, n = reasons.most_common(1)[0]
    if reason not in SHAPE_REASONS:
        return False, f"{where}: the first {n} record(s) are rejected ({reason}); the run counts the rest"
    view = view_record(piece.path, piece.kind, first_at[reason])
    raise ProbeError(f"input {where}: its first {sum(reasons.values())} record(s) are all rejected, most as "
                     f"{reason}: {explain(reason, text_field, view)}")


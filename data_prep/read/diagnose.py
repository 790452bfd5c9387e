"""Why records were rejected, and what to do about it: the fix for each reject reason, told with what the records
actually hold (their fields and types), so that "100% rejected as missing_text" reads "the records have no field
'text'; fields seen: content, id, url; rerun with --text-field content".

``view_record`` re-reads one record (a jsonl line at a byte offset or line number, a parquet or dataset schema);
``explain`` turns a reject reason and that view into one sentence. Used before any work (read/probe.py) and at the
end of a run that wrote nothing (write/yield_check.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import orjson

from data_prep import io, objstore
from data_prep.read import formats as fm

# Names a document's text is commonly stored under, preferred when suggesting a --text-field.
COMMON_TEXT_FIELDS = ("text", "content", "body", "document", "raw_content", "contents", "article", "passage",
                      "markdown", "code", "story")
STRING_TYPES = ("str", "string", "large_string", "string_view")  # JSON values, arrow and datasets column types
VIEW_LINE_BYTES = 1 << 20  # a jsonl record is re-read up to this many bytes (its fields are near its start)
VIEW_DECOMPRESSED = 64 << 20  # a compressed input is streamed at most this far to reach a line


@dataclass
class RecordView:
    """What an input record holds: ``fields`` name -> type ("str", "int", "list"; for parquet the column type), and
    for jsonl the length of each string value, to suggest the field most likely to hold the document."""

    where: str
    fields: Dict[str, str] = field(default_factory=dict)
    string_lengths: Dict[str, int] = field(default_factory=dict)
    schema: bool = False  # the fields are a parquet or dataset schema's columns

    def field_list(self) -> str:
        return ", ".join(f"{k} ({t})" for k, t in self.fields.items()) or "none"

    def suggestion(self, text_field: str) -> Optional[str]:
        """The field to try as --text-field: the longest string value (jsonl), else a common name among the string
        columns, else the only string column."""
        lengths = {k: n for k, n in self.string_lengths.items() if k != text_field}
        if lengths:
            return max(lengths, key=lambda k: lengths[k])
        strings = [k for k, t in self.fields.items() if k != text_field and t in STRING_TYPES]
        common = [k for k in strings if k.lower() in COMMON_TEXT_FIELDS]
        if common:
            return common[0]
        return strings[0] if len(strings) == 1 else None


def describe_object(obj, where: str) -> RecordView:
    """A parsed JSON record -> its view (a non-object: no fields)."""
    view = RecordView(where)
    if isinstance(obj, dict):
        for k, v in obj.items():
            view.fields[str(k)] = type(v).__name__ if v is not None else "null"
            if isinstance(v, str):
                view.string_lengths[str(k)] = len(v)
    return view


def schema_view(path: str, columns: Dict[str, str]) -> RecordView:
    return RecordView(objstore.redact(path), dict(columns), schema=True)


def parquet_columns(path: str) -> Dict[str, str]:
    """Column name -> arrow type of a parquet file (its footer only: ranged GETs on object storage)."""
    import pyarrow.parquet as pq

    with io.open_read(path, block_size=objstore.PROBE_BLOCK) as f:
        schema = pq.ParquetFile(f).schema_arrow
    return {name: str(schema.field(name).type) for name in schema.names}


def dataset_columns(path: str) -> Dict[str, str]:
    ds = fm.open_hf_dataset(path)
    return {name: getattr(feat, "dtype", type(feat).__name__) for name, feat in ds.features.items()}


def _jsonl_line(path: str, kind: str, position: int) -> Optional[bytes]:
    """The record at ``position`` (a byte offset for jsonl, a 1-based line number for .gz/.zst), bounded."""
    if kind == "jsonl":
        with io.open_read(path) as f:
            f.seek(position)
            return f.readline(VIEW_LINE_BYTES)
    seen = 0
    for n, line in enumerate(fm._lines(fm._decompressed_chunks(path, kind.rsplit(".", 1)[1]), VIEW_LINE_BYTES), 1):
        seen += len(line or b"")
        if n == position:
            return line
        if seen > VIEW_DECOMPRESSED:
            return None
    return None


def view_record(path: str, kind: str, position: int) -> Optional[RecordView]:
    """What the record at ``position`` of ``path`` holds, or None when it cannot be seen cheaply (a .txt file, a
    record too large, a line deep in a compressed file, an unreadable input)."""
    where = f"{objstore.redact(path)} at {'byte' if kind == 'jsonl' else 'line'} {position}"
    try:
        if kind == "parquet":
            return schema_view(path, parquet_columns(path))
        if kind == "hf":
            return schema_view(path, dataset_columns(path))
        if not kind.startswith("jsonl"):
            return None
        line = _jsonl_line(path, kind, position)
        return describe_object(orjson.loads(line), where) if line else None
    except Exception:  # a view is a hint: an unreadable record (or input) just gives none
        return None


def explain(reason: str, text_field: str, view: Optional[RecordView] = None) -> str:
    """One sentence: what ``reason`` means for these records and what to change."""
    noun = "column" if view is not None and view.schema else "field"
    if view is None:
        seen = ""
    elif view.schema:
        seen = f"; the columns of {view.where}: {view.field_list()}"
    else:
        seen = f"; fields seen in {view.where}: {view.field_list()}"
    better = view.suggestion(text_field) if view is not None else None
    retry = f"rerun with --text-field {better}" if better else f"rerun with --text-field NAME, the {noun} " \
                                                                "holding the document text"
    if reason == fm.MISSING_TEXT:
        return f"the records have no {noun} {text_field!r} (--text-field {text_field}){seen}; {retry}"
    if reason == fm.NON_STRING_TEXT:
        held = view.fields.get(text_field, "non-string") if view is not None else "non-string"
        return f"the {noun} {text_field!r} (--text-field) holds {held} values, not text{seen}; {retry}"
    if reason == fm.EMPTY_TEXT:
        return (f"the {noun} {text_field!r} (--text-field) is empty or whitespace only{seen}; check it names the "
                f"document body, or drop the empty records upstream")
    return FIXES.get(reason, "see the reject log for the records and their positions")


FIXES = {
    fm.MALFORMED_JSON: "the lines are not JSON: a .jsonl/.json input holds one JSON object per line (plain text "
                       "belongs in .txt files, one document per file)",
    fm.NOT_AN_OBJECT: 'the lines are JSON but not objects (arrays, strings or numbers): each line must be an object '
                      'such as {"text": "..."}',
    fm.INVALID_UTF8: "the input is not UTF-8 text: convert it first (e.g. iconv -f latin1 -t utf-8)",
    fm.NUL_BYTES: "the text holds NUL bytes (binary data?): strip them upstream or leave those files out",
    fm.TOO_LONG: "the documents are longer than --max-doc-tokens with --long-docs reject: raise --max-doc-tokens "
                 "or use --long-docs split",
    fm.RECORD_TOO_LARGE: "the records are larger than --max-record-size: raise it (e.g. --max-record-size 256Mi) "
                         "if they are real documents",
}

"""Readers: turn one input piece (a file, a byte range of a file, or a dataset) into records.

Every reader yields ``(position, text, reason)``: ``text`` is the document when the record is good, else ``None`` and
``reason`` says why it was rejected; with ``whole=True`` a fourth item follows, the whole record as a dict (every
input field, for outputs that write documents back as records; None for a rejected one). ``position`` is a byte offset (uncompressed .jsonl/.json and .txt), a 1-based line
number (.gz/.zst, where byte offsets of the decompressed stream mean little to a user) or a row index (parquet and
Hugging Face datasets); ``POSITION_KIND`` names which, for the reject log.

Memory is bounded whatever the input: a record (a jsonl line, a whole .txt file) longer than ``max_record`` bytes
(parquet and dataset text: characters) is rejected as ``record_too_large`` without ever being held whole (its bytes are
read past up to the next newline), and compressed inputs are decompressed a bounded piece at a time, so a newline-less
gzip bomb costs time, not memory.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import orjson

from data_prep import io, objstore
from data_prep.settings import DEFAULT_MAX_RECORD

Record = Tuple[int, Optional[str], Optional[str]]

# Reject reasons (the manifest and reject log use these names).
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_TEXT = "missing_text"
NON_STRING_TEXT = "non_string_text"
EMPTY_TEXT = "empty_text"
INVALID_UTF8 = "invalid_utf8"
NUL_BYTES = "nul_bytes"
TOO_LONG = "too_long"
RECORD_TOO_LARGE = "record_too_large"

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
TEXT_SUFFIXES = (".txt",)
PARQUET_SUFFIXES = (".parquet",)


class InputError(Exception):
    """An input that cannot be read to its end (truncated or corrupt compressed file, unreadable file)."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


@dataclass(frozen=True)
class Piece:
    """A part of one input: ``kind`` is jsonl | jsonl.gz | jsonl.zst | txt | parquet | hf; ``start``/``end`` are
    bytes for uncompressed jsonl (newline aligned), rows for hf/parquet, and 0/-1 (whole input) otherwise."""

    path: str
    kind: str
    start: int = 0
    end: int = -1

    def as_dict(self) -> dict:
        return {"path": self.path, "kind": self.kind, "start": self.start, "end": self.end}


def kind_of(path: str) -> Optional[str]:
    """The reader kind for a file name, or None when it is not an input we read."""
    low = path.lower()
    if low.endswith((".warc", ".warc.gz")):  # web archives: their HTML responses, for curate's extract step
        return "warc"
    for comp, tag in ((".gz", "gz"), (".zst", "zst"), (".zstd", "zst")):
        if low.endswith(comp):
            inner = low[: -len(comp)]
            return f"jsonl.{tag}" if inner.endswith(JSON_SUFFIXES) else None
    if low.endswith(JSON_SUFFIXES):
        return "jsonl"
    if low.endswith(TEXT_SUFFIXES):
        return "txt"
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return None


def check_text(value) -> Tuple[Optional[str], Optional[str]]:
    """(text, None) for a usable document, else (None, reason)."""
    if value is None:
        return None, MISSING_TEXT
    if not isinstance(value, str):
        return None, NON_STRING_TEXT
    if not value or value.isspace():
        return None, EMPTY_TEXT
    if "\x00" in value:
        return None, NUL_BYTES
    return value, None


def _parse_json_line(line: bytes, field: str) -> Tuple[Optional[str], Optional[str]]:
    try:
        obj = orjson.loads(line)  # refuses invalid UTF-8 too: only a refused line is decoded to say which it was
    except orjson.JSONDecodeError as e:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return None, INVALID_UTF8
        # orjson refuses lone surrogates (\ud800): text that cannot be UTF-8, not broken JSON.
        return None, INVALID_UTF8 if "surrogate" in str(e).lower() else MALFORMED_JSON
    if not isinstance(obj, dict):
        return None, NOT_AN_OBJECT
    if field not in obj:
        return None, MISSING_TEXT
    return check_text(obj[field])


def _parse_json_record(line: bytes, field: str):
    """_parse_json_line's (text, reason) and the parsed object (None when rejected: that rare path parses again)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict) or field not in obj:
        return (*_parse_json_line(line, field), None)
    text, reason = check_text(obj[field])
    return text, reason, (obj if text is not None else None)


def read_jsonl_range(piece: Piece, field: str, max_record: int = DEFAULT_MAX_RECORD,
                     whole: bool = False) -> Iterator[Record]:
    """Lines of an uncompressed .jsonl in [start, end); blank lines are not records."""
    end = piece.end if piece.end >= 0 else io.size(piece.path)
    with io.open_read(piece.path, buffering=1 << 20) as f:
        f.seek(piece.start)
        offset = piece.start
        while offset < end:
            line = f.readline(max_record + 1)  # a limit: ``for line in f`` would hold a newline-less file whole
            if not line:
                break
            pos = offset
            offset += len(line)
            if len(line) > max_record and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # read past the rest of it, a bounded piece at a time
                    line = f.readline(1 << 20)
                    offset += len(line)
                yield (pos, None, RECORD_TOO_LARGE) + ((None,) if whole else ())
                continue
            if line.isspace() or not line:
                continue
            if whole:
                yield pos, *_parse_json_record(line, field)
                continue
            text, reason = _parse_json_line(line, field)
            yield pos, text, reason


ZST_FEED = 4096  # compressed bytes per zstd call: at most ~128 MiB out even for a crafted input, usually ~16 KiB
# How each compressed kind starts (gzip's magic, or a bare zlib stream's header byte; zstd's frame magic)
MAGIC = {"gz": (b"\x1f\x8b", b"\x78"), "zst": (b"\x28\xb5\x2f\xfd",)}
# What a damaged input needs: a rerun reads the same bytes and fails the same way
DAMAGED = "rerunning will not help: replace it with a good copy (or move it out of the inputs), then rerun"


def not_compressed(path: str, tag: str, head: bytes) -> Optional[str]:
    """Why a .gz/.zst input whose first bytes are ``head`` is not that format (None when it starts as one)."""
    if not head or any(head.startswith(m) for m in MAGIC[tag]):
        return None
    plain = head.lstrip()[:1] in (b"{", b"[")
    return (f"not {tag} data (it starts with {head[:16]!r})"
            + (f": a plain .jsonl named .{tag}? rename it without .{tag}" if plain else
               f": not compressed with {'gzip' if tag == 'gz' else 'zstd'}; give it the name of its format"))


def _decompressed_chunks(path: str, tag: str, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Decompressed bytes of a .gz (all members) or .zst (all frames); raises InputError when truncated or corrupt."""
    try:
        f = io.open_read(path)
    except OSError as e:
        raise InputError(path, f"cannot open ({e.strerror})") from e
    with f:
        if tag == "gz":
            new = lambda: zlib.decompressobj(wbits=47)  # noqa: E731  (gzip or zlib header, auto-detected)
        else:
            import zstandard

            dctx = zstandard.ZstdDecompressor()
            new = dctx.decompressobj
        dobj, fed, first = new(), False, True
        while True:
            data = f.read(chunk)
            if not data:
                break
            if first and not_compressed(path, tag, data[:16]):
                raise InputError(path, f"{not_compressed(path, tag, data[:16])} (rerunning will not help)")
            first = False
            more = False  # gz: output held back by the size limit, with no input left to feed
            while data or more:
                try:
                    if tag == "gz":  # at most ``chunk`` bytes out per call: a bomb must not expand in one go
                        out = dobj.decompress(data, chunk)
                        rest = dobj.unconsumed_tail
                    else:  # zstandard has no output limit: feed it a small piece (a block expands to <= 128 KiB)
                        out = dobj.decompress(data[:ZST_FEED])
                        rest = data[ZST_FEED:]
                except MemoryError:  # a memory limit, not a corrupt file: the caller records it as such
                    raise
                except Exception as e:  # zlib.error / zstandard.ZstdError
                    raise InputError(path, f"corrupt {tag} data ({e}): the file is damaged; {DAMAGED}") from e
                fed = True
                if out:
                    yield out
                if dobj.eof:
                    data = dobj.unused_data + rest if tag != "gz" else dobj.unused_data
                    dobj, fed, more = new(), False, False
                else:
                    data = rest
                    more = tag == "gz" and len(out) == chunk
        if fed and not dobj.eof:
            raise InputError(path, f"truncated {tag} file (stream ends before the end of its last frame): an "
                                   f"incomplete copy; {DAMAGED}")


def _lines(blocks: Iterator[bytes], max_record: int) -> Iterator[Optional[bytes]]:
    """The lines of a stream of blocks (without their newline); None for a line longer than ``max_record``, which is
    never assembled. The unfinished line is kept as a list of parts: joining it to every block would be quadratic."""
    parts: list = []
    held = 0
    too_large = False
    for block in blocks:
        lines = block.split(b"\n")
        tail = lines.pop()
        if lines:  # the block ends the held line
            first = lines[0]
            if too_large or held + len(first) > max_record:
                lines[0] = None
            elif parts:
                lines[0] = b"".join(parts) + first
            parts, held, too_large = [], 0, False
            for line in lines:
                yield None if line is not None and len(line) > max_record else line
        if not too_large:
            parts.append(tail)
            held += len(tail)
            if held > max_record:
                parts, held, too_large = [], 0, True
    if too_large:
        yield None
    elif held:
        yield b"".join(parts)


def read_jsonl_compressed(piece: Piece, field: str, max_record: int = DEFAULT_MAX_RECORD,
                          whole: bool = False) -> Iterator[Record]:
    tag = piece.kind.rsplit(".", 1)[1]
    line_no = 0
    for line in _lines(_decompressed_chunks(piece.path, tag), max_record):
        line_no += 1
        if line is None:
            yield (line_no, None, RECORD_TOO_LARGE) + ((None,) if whole else ())
            continue
        if not line or line.isspace():
            continue
        if whole:
            yield line_no, *_parse_json_record(line, field)
            continue
        text, reason = _parse_json_line(line, field)
        yield line_no, text, reason


def read_txt(piece: Piece, field: str, max_record: int = DEFAULT_MAX_RECORD) -> Iterator[Record]:
    """A .txt file is one document (the whole file): splitting prose at blank lines would cut documents apart."""
    try:
        with io.open_read(piece.path) as f:
            raw = f.read(max_record + 1)  # never more than the limit in memory, whatever the file's size
    except OSError as e:
        raise InputError(piece.path, f"cannot read ({e.strerror})") from e
    if len(raw) > max_record:
        yield 0, None, RECORD_TOO_LARGE
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        yield 0, None, INVALID_UTF8
        return
    t, reason = check_text(text)
    yield 0, t, reason


def _check_size(text: Optional[str], reason: Optional[str], max_record: int) -> Tuple[Optional[str], Optional[str]]:
    # parquet and datasets hand over decoded strings (already in memory): the limit counts characters there
    if text is not None and len(text) > max_record:
        return None, RECORD_TOO_LARGE
    return text, reason


def read_parquet(piece: Piece, field: str, max_record: int = DEFAULT_MAX_RECORD) -> Iterator[Record]:
    """Rows of a parquet file (or of the row groups that start in [start, end)), streamed by record batch."""
    import pyarrow.parquet as pq

    try:
        # a URL: a file object doing ranged GETs (the footer, then only the row groups of this piece)
        pf = pq.ParquetFile(io.open_read(piece.path) if io.is_url(piece.path) else piece.path)
    except Exception as e:
        raise InputError(piece.path, f"not a readable parquet file ({e}); {DAMAGED}") from e
    md = pf.metadata
    firsts, row = [], 0
    for i in range(md.num_row_groups):
        firsts.append(row)
        row += md.row_group(i).num_rows
    stop = md.num_rows if piece.end < 0 else piece.end
    groups = [i for i, first in enumerate(firsts) if piece.start <= first < stop]
    if field not in pf.schema_arrow.names:
        for row in range(piece.start, stop):
            yield row, None, MISSING_TEXT
        return
    row = piece.start
    try:
        for batch in pf.iter_batches(columns=[field], batch_size=4096, row_groups=groups):
            for value in batch.column(0).to_pylist():
                text, reason = _check_size(*check_text(value), max_record)
                yield row, text, reason
                row += 1
    except OSError as e:
        raise InputError(piece.path, f"corrupt parquet data ({e}); {DAMAGED}") from e


def is_hf_dataset_dir(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, name)) for name in ("dataset_info.json", "dataset_dict.json", "state.json")
    )


def open_hf_dataset(path: str):
    """A Dataset saved with ``save_to_disk``; a DatasetDict becomes its splits concatenated in name order."""
    import datasets

    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        ds = datasets.concatenate_datasets([ds[name] for name in sorted(ds)])
    return ds


def read_hf(piece: Piece, field: str, max_record: int = DEFAULT_MAX_RECORD) -> Iterator[Record]:
    try:
        ds = open_hf_dataset(piece.path)
    except Exception as e:
        raise InputError(piece.path, f"not a dataset saved with save_to_disk ({e})") from e
    stop = len(ds) if piece.end < 0 else piece.end
    if field not in ds.column_names:
        for row in range(piece.start, stop):
            yield row, None, MISSING_TEXT
        return
    col = ds.select_columns([field])
    row = piece.start
    step = 2048
    for lo in range(piece.start, stop, step):
        for value in col[lo : min(lo + step, stop)][field]:
            text, reason = _check_size(*check_text(value), max_record)
            yield row, text, reason
            row += 1


def _read_warc(piece: Piece, field: str, max_record: int = DEFAULT_MAX_RECORD, whole: bool = False):
    from data_prep.read.warc import read_warc

    return read_warc(piece, field, max_record, whole)


READERS = {
    "jsonl": (read_jsonl_range, "byte_offset"),
    "jsonl.gz": (read_jsonl_compressed, "line"),
    "jsonl.zst": (read_jsonl_compressed, "line"),
    "txt": (read_txt, "byte_offset"),
    "parquet": (read_parquet, "row"),
    "hf": (read_hf, "row"),
    "warc": (_read_warc, "record"),
}


def read_piece(piece: Piece, field: str, max_record: int = DEFAULT_MAX_RECORD, whole: bool = False) -> Iterator[Record]:
    reader, _ = READERS[piece.kind]
    try:
        if not whole:
            yield from reader(piece, field, max_record)
        elif piece.kind in ("jsonl", "jsonl.gz", "jsonl.zst", "warc"):
            yield from reader(piece, field, max_record, whole=True)
        else:  # txt, parquet, datasets: the text alone, or the row's other columns read alongside
            yield from _with_rows(piece, field, reader(piece, field, max_record))
    except InputError:
        raise
    except Exception as e:
        # no credentials, access denied, endpoint unreachable: one line for the whole run, not one per unit
        denied = objstore.access_error(piece.path, e, "read", role="input")
        if denied is e:
            raise
        if denied is not None:
            raise denied from e
        if isinstance(e, OSError):
            raise InputError(piece.path, f"read failed ({e})") from e
        raise


def _with_rows(piece: Piece, field: str, records: Iterator[Record]) -> Iterator[Record]:
    """Records of a txt, parquet or dataset piece with the whole row: a .txt file is {field: text}; a parquet or
    dataset row every column (read by batches beside the text column's reader, rows in the same order)."""
    if piece.kind == "txt":
        for pos, text, reason in records:
            yield pos, text, reason, ({field: text} if text is not None else None)
        return
    rows = _all_rows(piece)
    for (pos, text, reason), row in zip(records, rows):
        yield pos, text, reason, (row if text is not None else None)


def _all_rows(piece: Piece) -> Iterator[dict]:
    if piece.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(io.open_read(piece.path) if io.is_url(piece.path) else piece.path)
        md, firsts, row = pf.metadata, [], 0
        for i in range(md.num_row_groups):
            firsts.append(row)
            row += md.row_group(i).num_rows
        stop = md.num_rows if piece.end < 0 else piece.end
        groups = [i for i, first in enumerate(firsts) if piece.start <= first < stop]
        for batch in pf.iter_batches(batch_size=4096, row_groups=groups):
            yield from batch.to_pylist()
        return
    ds = open_hf_dataset(piece.path)
    stop = len(ds) if piece.end < 0 else piece.end
    for lo in range(piece.start, stop, 2048):
        cols = ds[lo:min(lo + 2048, stop)]
        yield from (dict(zip(cols, values)) for values in zip(*cols.values()))


def position_kind(piece: Piece) -> str:
    return READERS[piece.kind][1]

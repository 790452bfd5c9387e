"""WARC input (.warc, .warc.gz): each HTTP response with an HTML body becomes a record, for the ``extract`` step.

Read by FastWARC (resiliparse's WARC reader, compiled); the body's encoding is taken from the HTTP header or the
bytes (resiliparse's detection), then decoded with fallbacks, never failing on a bad byte. A record's position is
its ordinal among the file's records. Other records (requests, metadata, non-HTML responses) are not documents and
are skipped; a truncated or corrupt file stops with InputError, like a corrupt compressed jsonl.
"""

from __future__ import annotations

from typing import Iterator

WARC_SUFFIXES = (".warc", ".warc.gz")


def read_warc(piece, field: str, max_record: int, whole: bool = False) -> Iterator[tuple]:
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    from data_prep import io
    from data_prep.read.formats import RECORD_TOO_LARGE, InputError, check_text

    try:
        f = io.open_read(piece.path)
    except OSError as e:
        raise InputError(piece.path, f"cannot read ({e.strerror})") from e
    with f:
        try:
            for i, rec in enumerate(ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True)):
                ctype = (rec.http_headers.get("Content-Type") or "").lower() if rec.http_headers else ""
                if "html" not in ctype:
                    continue
                body = rec.reader.read(max_record + 1)
                if len(body) > max_record:
                    yield (i, None, RECORD_TOO_LARGE) + ((None,) if whole else ())
                    continue
                charset = ctype.split("charset=", 1)[1].split(";")[0].strip() if "charset=" in ctype else None
                text, reason = check_text(bytes_to_str(body, charset or detect_encoding(body)))
                if not whole:
                    yield i, text, reason
                    continue
                record = None if text is None else {
                    "url": rec.headers.get("WARC-Target-URI"), "id": rec.headers.get("WARC-Record-ID"),
                    "date": rec.headers.get("WARC-Date"), field: text}
                yield i, text, reason, record
        except (OSError, EOFError, ValueError) as e:
            raise InputError(piece.path, f"corrupt or truncated WARC ({e})") from e

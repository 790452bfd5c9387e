"""--max-record-size: a record longer than the limit is rejected as record_too_large, in every input format, and
the readers never hold it whole (lines are read and decompressed a bounded piece at a time)."""

import gzip
import tracemalloc

import orjson
import pytest
import zstandard

from data_prep.read.formats import RECORD_TOO_LARGE, Piece, kind_of, read_piece

pytestmark = pytest.mark.unit

LIMIT = 1000


def _records(path, limit=LIMIT):
    return [(pos, reason) if text is None else (pos, text) for pos, text, reason in
            read_piece(Piece(str(path), kind_of(str(path))), "text", limit)]


def _lines():
    big = orjson.dumps({"text": "b" * 5000})
    edge = orjson.dumps({"text": "e" * (LIMIT - 11)})  # exactly LIMIT bytes: kept
    assert len(edge) == LIMIT
    return [orjson.dumps({"text": "small"}), big, edge, orjson.dumps({"text": "after"})]


def test_jsonl_plain_gz_and_zst_reject_long_lines_and_keep_the_rest(tmp_path):
    lines = _lines()
    raw = b"\n".join(lines) + b"\n"
    (tmp_path / "a.jsonl").write_bytes(raw)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    edge = "e" * (LIMIT - 11)
    offs = [0]
    for line in lines:
        offs.append(offs[-1] + len(line) + 1)
    assert _records(tmp_path / "a.jsonl") == [(0, "small"), (offs[1], RECORD_TOO_LARGE), (offs[2], edge),
                                              (offs[3], "after")]
    for name in ("a.jsonl.gz", "a.jsonl.zst"):
        assert _records(tmp_path / name) == [(1, "small"), (2, RECORD_TOO_LARGE), (3, edge), (4, "after")]
    # a newline-less last line over the limit
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b'{"text": "ok"}\n{"text": "' + b"x" * 10**6))
    assert _records(tmp_path / "b.jsonl.gz") == [(1, "ok"), (2, RECORD_TOO_LARGE)]
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "' + b"x" * 10**6)
    assert _records(tmp_path / "b.jsonl") == [(0, "ok"), (15, RECORD_TOO_LARGE)]


def test_txt_over_the_limit_is_rejected_without_reading_it_whole(tmp_path):
    (tmp_path / "small.txt").write_text("a small document")
    (tmp_path / "big.txt").write_bytes(b"y" * 10**6)
    assert _records(tmp_path / "small.txt") == [(0, "a small document")]
    tracemalloc.start()
    assert _records(tmp_path / "big.txt") == [(0, RECORD_TOO_LARGE)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100_000


def test_a_newline_less_gzip_stream_is_read_in_bounded_memory(tmp_path):
    bomb = gzip.compress(b'{"text": "' + b"z" * (64 << 20), compresslevel=1)  # 64 MiB, ~0.3 MiB on disk
    (tmp_path / "bomb.jsonl.gz").write_bytes(bomb)
    tracemalloc.start()
    assert _records(tmp_path / "bomb.jsonl.gz", limit=1 << 20) == [(1, RECORD_TOO_LARGE)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak  # the limit and a few 1 MiB blocks, not the 64 MiB line

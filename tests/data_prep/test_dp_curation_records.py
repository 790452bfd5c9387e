"""curate's plan and records: work units sized from the corpus (a small corpus still gives every worker work, whatever
-j), and kept documents written back as their whole input records (every field, any input format)."""

import gzip

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.support.data_prep import write_jsonl

from data_prep.curate import DEFAULT_UNITS, MAX_UNIT, MIN_UNIT, CurateSettings, plan, run, unit_size
from data_prep.read.formats import Piece

KEEP_ALL = {"steps": [{"quality": {"min_words": 3, "min_stop_words": None, "min_punctuation_line_fraction": None,
                                   "top_ngram_char_fraction": None, "dup_ngram_char_fraction": None,
                                   "max_duplicate_line_fraction": None}}]}


def _records(n, tag):
    return [{"id": f"{tag}-{i}", "url": f"https://example.org/{tag}/{i}", "content": f"document {i} of the {tag} set",
             "metadata": {"dump": "CC-MAIN-2024-10", "score": i / 10, "tags": [tag, str(i)]}} for i in range(n)]


@pytest.mark.unit
def test_default_unit_size_follows_the_corpus_not_the_workers(tmp_path):
    big = tmp_path / "big.jsonl"
    line = orjson.dumps({"text": "word " * 200}) + b"\n"
    with open(big, "wb") as f:
        f.write(line * (50 * (1 << 20) // len(line)))  # ~50 MB
    pieces = [Piece(str(big), "jsonl")]
    assert unit_size(pieces, None) == MIN_UNIT  # 50 MB / 128 units is below the floor: 16 MiB units
    assert unit_size(pieces, 123_456) == 123_456  # --shard-size wins
    s1 = CurateSettings(inputs=[str(big)], output_dir=str(tmp_path / "o"), steps=KEEP_ALL, workers=1)
    s8 = CurateSettings(inputs=[str(big)], output_dir=str(tmp_path / "o"), steps=KEEP_ALL, workers=8,
                        slice_index=1, slice_count=3)
    units = plan(s1)
    assert len(units) == 4, "a 50 MiB corpus is cut into 16 MiB units (the last one short), not one unit"
    assert [u.key() for u in plan(s8)] == [u.key() for u in units]  # the same plan whatever -j and --slice
    huge = [Piece(str(big), "jsonl")] * 200  # 10 GB listed: 128 units of ~82 MB
    assert unit_size(huge, None) == -(-200 * big.stat().st_size // DEFAULT_UNITS)
    assert unit_size(huge * 10, None) == MAX_UNIT


@pytest.mark.multiproc
def test_kept_documents_keep_every_input_field_in_every_format(tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    plain, packed, table = _records(6, "plain"), _records(4, "gz"), _records(5, "parquet")
    plain[2]["content"] = "too short"  # removed by min_words: 3 ... and its fields with it
    write_jsonl(inp / "a.jsonl", plain)
    with gzip.open(inp / "b.jsonl.gz", "wb") as f:
        f.write(b"".join(orjson.dumps(r) + b"\n" for r in packed))
    pq.write_table(pa.Table.from_pylist(table), inp / "c.parquet")
    (inp / "d.txt").write_text("a plain text file of eight words here")
    m = run(CurateSettings(inputs=[str(inp)], output_dir=str(tmp_path / "out"), steps=KEEP_ALL,
                           text_field="content", workers=2, quiet=True))
    got = []
    for entry in m["files"]:
        got += [orjson.loads(line) for line in open(tmp_path / "out" / entry["file"], "rb")]
    want = [r for r in plain if r["content"] != "too short"] + packed + table + [
        {"content": "a plain text file of eight words here"}]
    assert got == want  # every field, its value and its type, in input order
    assert m["totals"]["removed"] == {"quality": {"doc_words": 1}}

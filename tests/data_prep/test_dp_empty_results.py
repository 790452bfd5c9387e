"""Valid-looking data that gives no documents fails loudly (issue 22 item 4): a wrong --text-field, a parquet without
the column and non-string text are refused before any work, naming the fields present and the flag to use; an empty
input, all-empty documents, or more than --max-reject-fraction rejected fail at the manifest merge (exit 2, no
manifest) naming the top reason and its fix; a sliced run is judged on its totals, not per slice; `slurm --dry-run`
and `probe` refuse before any script is written."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.support.data_prep import run_cli, write_jsonl

pytestmark = pytest.mark.multiproc


def _refused(r) -> str:
    """The one-line refusal on stderr of an exit-2 run (no traceback)."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def _no_work_done(out) -> None:
    """Refused before any work: no plan, no unit output (the output directory may exist, empty)."""
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == []


def test_wrong_text_field_is_refused_before_any_work_with_the_field_to_use(tmp_path, sp_model):
    docs = [f"document number {i} with some words" for i in range(20)]
    src = write_jsonl(tmp_path / "web.jsonl", [{"id": i, "content": t} for i, t in enumerate(docs)])
    out = tmp_path / "out"
    line = _refused(run_cli("tokenize", src, "-o", out, "-t", sp_model, "-j", "1", "-q", check=False))
    assert f"input {src}:" in line
    assert "no field 'text' (--text-field text)" in line
    assert f"fields seen in {src} at byte 0: id (int), content (str)" in line
    assert line.endswith("rerun with --text-field content")
    _no_work_done(out)
    # the suggested flag works: every record becomes a document
    run_cli("tokenize", src, "-o", out, "-t", sp_model, "-j", "1", "-q", "--text-field", "content")
    m = json.load(open(out / "manifest.json"))
    assert m["totals"]["documents"] == len(docs) and m["totals"]["rejected"] == {}


def test_parquet_without_the_column_or_with_a_non_text_one_is_refused_from_its_schema(tmp_path, sp_model):
    nocol = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"body": ["a document", "another one"], "n": [1, 2]}), nocol)
    line = _refused(run_cli("tokenize", nocol, "-o", tmp_path / "o1", "-t", sp_model, "-j", "1", "-q",
                            check=False))
    assert f"input {nocol}: the records have no column 'text' (--text-field text)" in line
    assert f"the columns of {nocol}: body (string), n (int64)" in line
    assert line.endswith("rerun with --text-field body")
    _no_work_done(tmp_path / "o1")

    ints = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), ints)
    line = _refused(run_cli("tokenize", ints, "-o", tmp_path / "o2", "-t", sp_model, "-j", "1", "-q", check=False))
    assert "the column 'text' (--text-field) holds int64 values, not text" in line
    _no_work_done(tmp_path / "o2")


def test_non_string_text_in_jsonl_is_refused_naming_the_type(tmp_path, sp_model):
    src = write_jsonl(tmp_path / "nums.jsonl", [{"text": i, "title": f"title {i}"} for i in range(5)])
    line = _refused(run_cli("tokenize", src, "-o", tmp_path / "out", "-t", sp_model, "-j", "1", "-q",
                            check=False))
    assert "all rejected, most as non_string_text" in line
    assert "the field 'text' (--text-field) holds int values, not text" in line
    assert line.endswith("rerun with --text-field title")
    _no_work_done(tmp_path / "out")


def test_empty_input_and_empty_documents_fail_at_the_end_without_a_manifest(tmp_path, sp_model):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    out = tmp_path / "o1"
    line = _refused(run_cli("tokenize", empty, "-o", out, "-t", sp_model, "-j", "1", "-q", check=False))
    assert line == (f"error: no documents written to {out}: the inputs hold no records (1 input file(s), empty or "
                    "blank lines only); check the input paths, and that .jsonl files hold one JSON object per line")
    assert (out / "plan.json").exists() and not (out / "manifest.json").exists()

    blank = write_jsonl(tmp_path / "blank.jsonl", [{"text": " " * (i + 1)} for i in range(5)])
    out = tmp_path / "o2"
    line = _refused(run_cli("tokenize", blank, "-o", out, "-t", sp_model, "-j", "1", "-q", check=False))
    assert f"no documents written to {out}: all 5 records were rejected, most as empty_text (5)" in line
    assert "the field 'text' (--text-field) is empty or whitespace only" in line
    assert not (out / "manifest.json").exists()
    assert [json.loads(x)["reason"] for x in open(out / "rejects.jsonl")] == ["empty_text"] * 5


def _mixed_corpus(d):
    """One good document first (the up-front probe passes), then 9 records without the text field."""
    d.mkdir()
    write_jsonl(d / "a_good.jsonl", [{"text": "a good document with enough words to be one"}])
    write_jsonl(d / "b_bad.jsonl", [{"content": f"document {i} body text", "url": f"http://x/{i}"}
                                    for i in range(9)])
    return d


def test_max_reject_fraction_fails_with_the_reason_and_reruns_reuse_the_units(tmp_path, sp_model):
    src = _mixed_corpus(tmp_path / "in")
    out = tmp_path / "out"
    base = ["tokenize", src, "-o", out, "-t", sp_model, "-j", "1"]
    run_cli(*base, "-q")  # the default (1.0): a run with a document passes, rejects and all
    assert json.load(open(out / "manifest.json"))["totals"]["rejected"] == {"missing_text": 9}

    line = _refused(run_cli(*base, "--max-reject-fraction", "0.5", check=False))
    assert ("9 of 10 records (90.0%) were rejected, more than --max-reject-fraction 0.5, most as missing_text (9): "
            "the records have no field 'text' (--text-field text); fields seen in "
            f"{src / 'b_bad.jsonl'} at byte 0: content (str), url (str); rerun with --text-field content") in line
    assert not (out / "manifest.json").exists()  # the earlier run's is gone: nothing may look complete
    assert sum(1 for _ in open(out / "rejects.jsonl")) == 9

    r = run_cli(*base, "--max-reject-fraction", "0.95")
    assert "1 already complete, 0 to do" in r.stderr  # the finished unit was reused, not redone
    assert json.load(open(out / "manifest.json"))["totals"]["documents"] == 1


def test_a_sliced_run_is_judged_on_its_totals_at_the_merge(tmp_path, sp_model):
    """Slice 1 holds only rejected records: alone it passes (another slice has documents); the slice that finishes
    last sees the totals and fails, as does --merge-only."""
    src = _mixed_corpus(tmp_path / "in")
    out = tmp_path / "out"
    base = ["tokenize", src, "-o", out, "-t", sp_model, "-j", "1", "--shard-size", "120",
            "--max-reject-fraction", "0.5"]
    run_cli(*base, "--slice", "1/2", "-q")  # exit 0: its share is done, and the run's totals are not known yet
    slice1 = json.loads((out / "plan.json").read_text())["units"][1::2]
    assert slice1 and all(p["path"].endswith("b_bad.jsonl") for u in slice1 for p in u["inputs"])
    assert not (out / "manifest.json").exists()

    line = _refused(run_cli(*base, "--slice", "0/2", "-q", check=False))
    assert "9 of 10 records (90.0%) were rejected" in line and "rerun with --text-field content" in line
    line = _refused(run_cli(*base, "--merge-only", "-q", check=False))
    assert "9 of 10 records (90.0%) were rejected" in line
    assert not (out / "manifest.json").exists()


def test_slurm_dry_run_and_probe_refuse_before_writing_any_script(tmp_path, sp_model):
    src = write_jsonl(tmp_path / "web.jsonl", [{"content": f"doc {i}"} for i in range(3)])
    scripts, out = tmp_path / "scripts", tmp_path / "shards" / "web"
    run = ["--", "tokenize", src, "-o", out, "-t", sp_model]
    line = _refused(run_cli("slurm", "--tasks", "4000", "--dry-run", "--scripts-dir", scripts, *run, check=False))
    assert "no field 'text'" in line and "rerun with --text-field content" in line
    assert not scripts.exists() and not out.exists()
    line = _refused(run_cli("probe", *run, check=False))
    assert "no field 'text'" in line

    r = run_cli("slurm", "--tasks", "4000", "--dry-run", "--scripts-dir", scripts, *run, "--text-field", "content")
    assert f"# probed: {src}: field 'content' holds text" in r.stdout
    assert f"# probed: output {out}: can be created (under {tmp_path})" in r.stdout
    assert (scripts / "array_0000.sbatch").exists() and not out.exists()  # a dry run creates no output
    r = run_cli("probe", *run, "--text-field", "content")
    assert r.stdout.splitlines()[-1] == "tokenize: the inputs can be read and the output written"


def test_plan_refuses_a_sample_without_the_text_field(tmp_path):
    src = write_jsonl(tmp_path / "sample.jsonl", [{"body": f"document {i} " * 20} for i in range(20)])
    line = _refused(run_cli("plan", "--corpus-size", "1G", "--sample", src, check=False))
    assert "no field 'text'" in line and "rerun with --text-field body" in line



def test_one_odd_file_before_the_documents_does_not_stop_the_run(tmp_path, sp_model):
    """A stray metadata .json listed first is not refused while a later input of its kind gives documents: its
    records are rejected and counted, as before."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "a_meta.json").write_text(json.dumps({"name": "web crawl", "rows": 3}, indent=1))
    write_jsonl(d / "b_docs.jsonl", [{"text": f"document {i} of the crawl"} for i in range(3)])
    out = tmp_path / "out"
    r = run_cli("probe", "--", d, "-o", out, "-t", sp_model)
    assert f"probed: input {d / 'a_meta.json'}: its first 4 record(s) are all rejected, most as malformed_json" \
        in r.stdout and f"(its records will be rejected; {d / 'b_docs.jsonl'} gives documents)" in r.stdout
    run_cli("tokenize", d, "-o", out, "-t", sp_model, "-j", "1", "-q")
    m = json.load(open(out / "manifest.json"))
    assert m["totals"]["documents"] == 3 and m["totals"]["rejected"] == {"malformed_json": 4}

"""Every mistake stopped before work starts in one line naming the fix, and no message that points the wrong way
(issue 42 item 3): a plain file named .gz/.zst is refused before any work; a corrupt or truncated one fails its unit
saying that a rerun will not help and what will; counts out of range and paths of the wrong kind are refused by the
parser or before the tokenizer is loaded, exit 2, one `error:` line."""

import gzip
import os

import pytest
from tests.support.data_prep import cli_here, write_jsonl

from data_prep.executors.base import UnitsFailed
from data_prep.pipeline import Settings, run
from data_prep.read.probe import ProbeError

pytestmark = pytest.mark.unit


@pytest.fixture()
def docs(texts):
    return [{"text": t} for t in texts[:10]]


def _settings(inputs, out, tok):
    return Settings(inputs=[str(i) for i in inputs], output_dir=str(out), tokenizer=tok, workers=1, quiet=True)


def test_a_plain_file_named_gz_or_zst_is_refused_before_any_work(tmp_path, docs, sp_model):
    good = tmp_path / "in" / "a.jsonl.gz"
    good.parent.mkdir()
    good.write_bytes(gzip.compress(b"".join(f'{{"text": "{i}"}}\n'.encode() for i in range(5))))
    plain = write_jsonl(tmp_path / "in" / "b.jsonl.gz", [{"text": "a plain document"}] * 10)  # probed after a.jsonl.gz
    out = tmp_path / "out"
    with pytest.raises(ProbeError) as e:
        run(_settings([tmp_path / "in"], out, sp_model))
    assert str(e.value) == (f"input {plain}: not gz data (it starts with b'{{\"text\":\"a plain'): a plain .jsonl "
                            "named .gz? rename it without .gz")
    assert not out.exists() or not os.listdir(out)
    os.rename(plain, tmp_path / "in" / "b.jsonl")  # the fix it names works
    assert run(_settings([tmp_path / "in"], out, sp_model))["totals"]["documents"] == 15

    zst = write_jsonl(tmp_path / "c.jsonl.zst", docs)
    with pytest.raises(ProbeError, match=rf"input {zst}: not zst data .*rename it without \.zst"):
        run(_settings([zst], tmp_path / "out2", sp_model))


def test_a_corrupt_or_truncated_gz_fails_its_unit_saying_a_rerun_will_not_help(tmp_path, docs, sp_model):
    d = tmp_path / "in"
    d.mkdir()
    body = gzip.compress(b"".join(f'{{"text": "document {i} {"x" * 200}"}}\n'.encode() for i in range(400)))
    (d / "cut.jsonl.gz").write_bytes(body[: len(body) // 2])
    damaged = bytearray(body)
    damaged[-6] ^= 0xFF  # inside the CRC-32 of the trailer: every byte decodes, the check fails
    (d / "flip.jsonl.gz").write_bytes(bytes(damaged))
    write_jsonl(d / "ok.jsonl", docs)
    with pytest.raises(UnitsFailed) as e:
        run(_settings([d], tmp_path / "out", sp_model))
    msg = str(e.value)
    head, *lines = msg.splitlines()
    assert head == ("2 unit(s) failed; the other units are complete and a rerun keeps them. Fix what a line says (a "
                    "damaged input fails again as it is), then rerun the same command to redo these:")
    assert "retry" not in msg
    assert any(f"{d / 'cut.jsonl.gz'}: truncated gz file" in x and "an incomplete copy; rerunning will not help: "
               "replace it with a good copy (or move it out of the inputs), then rerun" in x for x in lines), msg
    assert any(f"{d / 'flip.jsonl.gz'}: corrupt gz data" in x and "the file is damaged; rerunning will not help" in x
               for x in lines), msg


@pytest.mark.parametrize("args, said", [
    (["-j", "0"], "-j/--workers: wants a whole number of at least 1, got '0'"),
    (["-j", "-2"], "-j/--workers: wants a whole number of at least 1, got '-2'"),
    (["--shard-size", "0"], "--shard-size: wants a size of at least 1 byte (e.g. 256M), got '0'"),
    (["--max-doc-tokens", "0"], "--max-doc-tokens: wants a whole number of at least 1, got '0'"),
    (["--verify-fraction", "1.5"], "--verify-fraction: wants a fraction in 0..1 (e.g. 0.5), got '1.5'"),
    (["--eod-id", "-1"], "--eod-id: wants a whole number of at least 0, got '-1'"),
    (["--upload-part-size", "0"], "--upload-part-size: wants a size of at least 1 byte (e.g. 256M), got '0'"),
], ids=lambda x: x[0] if isinstance(x, list) else "")
def test_counts_out_of_range_are_refused_by_the_parser(args, said, tmp_path, sp_model, corpus_dir, capsys):
    r = cli_here(capsys, "tokenize", corpus_dir, "-o", tmp_path / "out", "-t", sp_model, *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(said), r.stderr
    assert not (tmp_path / "out").exists()


def test_paths_of_the_wrong_kind_are_refused_naming_what_to_give(tmp_path, sp_model, corpus_dir, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    src = corpus_dir / "stdlib.jsonl"

    def refused(*args):
        r = cli_here(capsys, *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        return r.stderr.strip().splitlines()[-1]

    assert refused("tokenize", src, "-o", tmp_path / "o", "-t", empty) == (
        f"error: {empty} is a directory without a tokenizer (no tokenizer.json, tokenizer_config.json, "
        "tokenizer.model); give a sentencepiece .model, a tokenizer.json, or a transformers directory holding one")
    assert refused("tokenize", src, "-o", tmp_path / "o", "-t", sp_model, "--eod-id", "99999").startswith(
        f"error: --eod-id 99999 is not an id of {sp_model} (its vocabulary has 800 ids, 0..799)")
    assert refused("train-tokenizer", src, "-o", f"{empty}/", "-q") == (
        f"error: -o {empty}/ is a directory, but -o is a prefix: the model is written to PREFIX.model and "
        f"PREFIX.vocab; give e.g. -o {empty}/sp")
    assert not os.listdir(empty)  # no hidden ".model" written into it
    assert refused("blend", f"w={tmp_path}:1", "-o", empty) == (
        f"error: blend -o {empty} is a directory; give the blend file to write, e.g. -o {empty}/blend.json")
    afile = tmp_path / "afile"
    afile.write_text("")
    assert refused("tokenize", src, "-o", afile, "-t", sp_model) == (
        f"error: output {afile} is a file, not a directory; choose another --output (a directory, created when "
        "missing)")
    assert not (tmp_path / "o").exists()


def test_verify_stats_and_merge_take_the_manifest_file_as_well_as_its_directory(tmp_path, sp_model, corpus_dir,
                                                                               capsys):
    out = tmp_path / "out"
    run(_settings([corpus_dir / "stdlib.jsonl"], out, sp_model))
    r = cli_here(capsys, "verify", out / "manifest.json")  # used to look for out/manifest.json/manifest.json
    assert r.returncode == 0 and r.stdout.strip() == f"{out}: OK", r.stderr
    assert cli_here(capsys, "stats", out / "manifest.json", "--decode", "0").stdout.startswith(f"{out}: ")
    assert cli_here(capsys, "merge", out / "manifest.json", "-o", tmp_path / "merged", "-q").returncode == 0
    assert (tmp_path / "merged" / "manifest.json").is_file()

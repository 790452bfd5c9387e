"""Shards are checked against their manifest's sha256 before they are trusted (issue 42 item 2): the default check
(.idx sha256 + the .bin size it implies) and the full one (+ .bin sha256) name the damaged file; `merge` refuses a
damaged source instead of carrying it into a new shard under a fresh checksum; `data_prep verify` of a damaged
manifest names the file; `data.verify` is a recipe setting."""

import json
import re
import shutil

import pytest
from tests.support.data_prep import cli_here, write_jsonl

from data_prep.pipeline import Settings, run
from data_prep.write.verify import ShardIntegrityError, check_recorded, verify_recorded

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def good(tmp_path_factory, texts, sp_model):
    d = tmp_path_factory.mktemp("integrity")
    write_jsonl(d / "a.jsonl", [{"text": t} for t in texts[:30]])
    run(Settings(inputs=[str(d / "a.jsonl")], output_dir=str(d / "out"), tokenizer=sp_model, shard_size=30_000,
                 workers=1, quiet=True))
    return d / "out"


@pytest.fixture()
def out(good, tmp_path):
    shutil.copytree(good, tmp_path / "out")
    return tmp_path / "out"


def _recorded(out):
    m = json.load(open(out / "manifest.json"))
    return {str(out / sh["prefix"]): (sh["sha256_idx"], sh["sha256_bin"]) for sh in m["shards"]}


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def test_good_shards_pass_both_checks(out):
    rec = _recorded(out)
    assert len(rec) >= 2
    verify_recorded(list(rec), rec)
    verify_recorded(list(rec), rec, full=True)


def test_a_flipped_byte_in_an_idx_is_refused_by_the_default_check_naming_the_file(out):
    rec = _recorded(out)
    victim = sorted(rec)[1]
    _flip(victim + ".idx", 40)  # inside the lengths: same size, valid header
    with pytest.raises(ShardIntegrityError) as e:
        verify_recorded(list(rec), rec)
    assert str(e.value).startswith(f"{victim}.idx: sha256 does not match its manifest (")
    assert "python -m data_prep verify DIR" in str(e.value)


def test_a_flipped_byte_in_a_bin_is_refused_by_the_full_check_only(out):
    rec = _recorded(out)
    victim = sorted(rec)[0]
    _flip(victim + ".bin", 7)
    verify_recorded(list(rec), rec)  # the default check reads no .bin byte (its cost: docs/data_prep.md)
    with pytest.raises(ShardIntegrityError, match=rf"^{victim}\.bin: sha256 does not match its manifest .*\(bit rot"):
        verify_recorded(list(rec), rec, full=True)


def test_a_truncated_bin_is_refused_by_the_default_check(out):
    rec = _recorded(out)
    victim = sorted(rec)[0]
    with open(victim + ".bin", "r+b") as f:
        f.truncate(100)
    problems = check_recorded(victim, *rec[victim])
    assert problems and problems[0].startswith(f"{victim}.bin is 100 bytes but its index says ")


def test_a_rank_checks_its_share_only(out):
    rec = _recorded(out)
    victim = sorted(rec)[1]
    _flip(victim + ".idx", 40)
    verify_recorded(sorted(rec), rec, share=(0, 2))  # shards 0, 2, ...: not the damaged one
    with pytest.raises(ShardIntegrityError, match="shard_000001.idx"):
        verify_recorded(sorted(rec), rec, share=(1, 2))


def test_merge_refuses_a_damaged_source_naming_it(out, tmp_path, capsys):
    from data_prep.write.merge import merge

    _flip(out / "shard_000001.bin", 3)
    with pytest.raises(ShardIntegrityError, match=r"^merge: .*shard_000001\.bin: sha256 does not match its manifest"):
        merge([str(out)], str(tmp_path / "merged"), 1 << 30, quiet=True)
    assert not (tmp_path / "merged" / "manifest.json").exists()
    r = cli_here(capsys, "merge", out, "-o", tmp_path / "m2", "-q")
    assert r.returncode == 2 and "shard_000001.bin: sha256 does not match" in r.stderr
    assert "Traceback" not in r.stderr


def test_stats_checks_each_idx_before_reading_it(out, capsys):
    _flip(out / "shard_000000.idx", 40)
    r = cli_here(capsys, "stats", out, "--decode", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: {out}/shard_000000.idx: sha256 does not match its manifest")


@pytest.mark.parametrize("damage, said", [
    (lambda t: t[:200], "not valid JSON ("),  # cut short: the line and column of the break
    (lambda t: "[]", "not a data_prep manifest (tokenizer, shards, totals missing"),
    (lambda t: json.dumps({**json.loads(t), "dtype": None}), "no dtype or tokenizer.vocab_size"),
    (lambda t: json.dumps({**json.loads(t), "shards": [{"documents": 1}]}), "shard entry 0 lacks 'prefix'"),
], ids=["cut", "not-a-manifest", "no-dtype", "entry"])
def test_verify_of_a_damaged_manifest_names_the_file(out, damage, said, capsys):
    text = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(damage(text))
    r = cli_here(capsys, "verify", out)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"FAIL {out}/manifest.json") and said in line, line
    if said.startswith("not valid"):
        assert re.match(rf"FAIL {out}/manifest.json:\d+:\d+: not valid JSON", line)


def test_data_verify_is_a_recipe_setting():
    from pydantic import ValidationError

    from recipes.config.schema import DataConfig

    assert DataConfig().verify == "index" and DataConfig(verify="full").verify == "full"
    with pytest.raises(ValidationError, match="'index' or 'full'"):
        DataConfig(verify="sha256")

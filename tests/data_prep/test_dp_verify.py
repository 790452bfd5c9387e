"""verify passes on good output, and names the shard for a corrupted .bin, a truncated .idx or a missing file."""

import shutil

import pytest
from tests.support.data_prep import run_cli, write_jsonl

from data_prep.pipeline import Settings, run
from data_prep.write.verify import verify

pytestmark = pytest.mark.multiproc


def _make(tmp_path, texts, sp_model):
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts[:20]])
    out = tmp_path / "out"
    run(Settings(inputs=[str(tmp_path / "a.jsonl")], output_dir=str(out), tokenizer=sp_model, shard_size=50_000,
                 quiet=True))
    return out


def test_verify_ok_then_catches_corruption(tmp_path, texts, sp_model):
    out = _make(tmp_path, texts, sp_model)
    assert verify(str(out)) == []
    good = tmp_path / "good"
    shutil.copytree(out, good)

    # one flipped token in a .bin: counts and structure are fine, the checksum is not
    with open(out / "shard_000001.bin", "r+b") as f:
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 0x01]))
    problems = verify(str(out))
    assert problems and all("shard_000001" in p for p in problems) and any("sha256 of .bin" in p for p in problems)
    r = run_cli("verify", out, check=False)
    assert r.returncode == 1 and "shard_000001" in r.stderr

    # a truncated .idx
    shutil.rmtree(out)
    shutil.copytree(good, out)
    size = (out / "shard_000000.idx").stat().st_size
    with open(out / "shard_000000.idx", "r+b") as f:
        f.truncate(size - 8)
    problems = verify(str(out))
    assert problems and "shard_000000" in problems[0] and "truncated" in problems[0]

    # a missing .bin
    shutil.rmtree(out)
    shutil.copytree(good, out)
    (out / "shard_000002.bin").unlink()
    assert any("shard_000002" in p and "missing" in p for p in verify(str(out)))

    # a .bin with a token past the vocabulary, checksums skipped: still caught
    shutil.rmtree(out)
    shutil.copytree(good, out)
    with open(out / "shard_000000.bin", "r+b") as f:
        f.write(b"\xff\xff")
    assert any("vocab" in p for p in verify(str(out), checksums=False))

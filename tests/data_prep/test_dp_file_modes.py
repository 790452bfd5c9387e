"""Outputs are created with explicit modes: 0644 for data (shards, indexes, manifests, logs) whatever the umask
(a umask of 0 must not make them world-writable), 0600 where asked for secrets; a stricter umask still wins.
With --file-mode (data_prep.file_modes) every file is created with that mode and every directory with the matching
mode with x; the value is checked (octal, owner rw, no x, never world-writable)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_prep import file_modes, io
from data_prep.write.rejects import RejectLog
from data_prep.write.shards import ShardWriter

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def umask(monkeypatch):
    """The umask, and data_prep.file_modes' process state, restored after the test."""
    old = os.umask(0o022)
    monkeypatch.setattr(file_modes, "_mode", None)
    monkeypatch.delenv(file_modes.ENV, raising=False)
    yield lambda m: os.umask(m)
    os.umask(old)


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.unit
def test_data_files_are_0644_and_secrets_0600_under_a_permissive_umask(tmp_path, umask):
    umask(0)
    io.atomic_write(str(tmp_path / "manifest.json"), "{}")
    io.atomic_write(str(tmp_path / "token"), "s3cret", mode=io.SECRET_MODE)
    w = ShardWriter(str(tmp_path / "shard_000000"), np.uint16)
    w.add_document([np.arange(5, dtype=np.uint16)])
    w.finalize()
    log = RejectLog(str(tmp_path), "shard_000000")
    log.add("f.jsonl", "line", 1, "empty_text")
    log.commit()
    assert {p.name: _mode(p) for p in tmp_path.iterdir()} == {
        "manifest.json": 0o644, "token": 0o600, "shard_000000.bin": 0o644, "shard_000000.idx": 0o644,
        "shard_000000.rejects.jsonl": 0o644}


@pytest.mark.unit
def test_a_stricter_umask_still_narrows_and_a_leftover_tmp_does_not_keep_its_mode(tmp_path, umask):
    umask(0o077)
    io.atomic_write(str(tmp_path / "a"), "x")
    assert _mode(tmp_path / "a") == 0o600
    umask(0)
    leftover = tmp_path / "b.tmp"
    leftover.write_text("old")
    os.chmod(leftover, 0o666)
    io.atomic_write(str(tmp_path / "b"), "new")
    assert _mode(tmp_path / "b") == 0o644 and (tmp_path / "b").read_text() == "new"


def _write_everything(d):
    io.atomic_write(str(d / "manifest.json"), "{}")
    io.atomic_write(str(d / "token"), "s3cret", mode=io.SECRET_MODE)
    w = ShardWriter(str(d / "shard_000000"), np.uint16)
    w.add_document([np.arange(5, dtype=np.uint16)])
    w.finalize()
    log = RejectLog(str(d), "shard_000000")
    log.add("f.jsonl", "line", 1, "empty_text")
    log.commit()
    (d / "sub").mkdir()  # a directory made by anyone in the process (mkdir's 0777, narrowed by the umask)
    (d / "sub" / "lib.txt").write_text("x")  # a file a library opens with Python's default 0666


@pytest.mark.unit
@pytest.mark.parametrize("text,files,dirs", [("0640", 0o640, 0o750), ("0600", 0o600, 0o700),
                                             ("0660", 0o660, 0o770)])
def test_a_file_mode_is_every_files_mode_and_secrets_stay_0600(tmp_path, umask, text, files, dirs):
    umask(0)  # the mode, not the umask it replaces, decides
    file_modes.apply(file_modes.parse(text, "--file-mode"))
    _write_everything(tmp_path)
    assert {p.name: _mode(p) for p in tmp_path.rglob("*")} == {
        "manifest.json": files, "token": 0o600, "shard_000000.bin": files, "shard_000000.idx": files,
        "shard_000000.rejects.jsonl": files, "sub": dirs, "lib.txt": files}
    assert os.environ[file_modes.ENV] == text  # children started from here (spawned workers) inherit it


@pytest.mark.unit
@pytest.mark.parametrize("text,why", [("0666", "every user write"), ("0644x", "not an octal"), ("640.0", "not an"),
                                      ("0750", "execute bits"), ("0440", "owner read and write"),
                                      ("4640", "not an octal"), ("", "not an octal")])
def test_bad_file_modes_are_refused_naming_the_field(text, why):
    with pytest.raises(ValueError) as e:
        file_modes.parse(text, "--file-mode")
    assert str(e.value).startswith("--file-mode: ") and why in str(e.value)


@pytest.mark.unit
def test_a_bad_file_mode_on_the_command_line_exits_2_before_anything_is_written(tmp_path, capsys):
    from data_prep.cli import main

    with pytest.raises(SystemExit) as e:
        main(["tokenize", str(tmp_path), "-o", str(tmp_path / "out"), "-t", "x", "--file-mode", "0777"])
    assert e.value.code == 2 and "--file-mode: 0777 lets every user write" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _tokenize(tmp_path, sp_model, corpus_dir, *extra):
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(file_modes.ENV, None)
    proc = subprocess.run([sys.executable, "-m", "data_prep", "tokenize", str(corpus_dir), "-o", str(out), "-t",
                           sp_model, "-j", "2", "--shard-size", "64k", "-q", *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["shards"]
    return out


def _tree_modes(root):
    return {str(p.relative_to(root)) + ("/" if p.is_dir() else ""): _mode(p) for p in [root, *root.rglob("*")]}


@pytest.mark.multiproc
def test_tokenize_with_file_mode_0640_writes_every_file_0640(tmp_path, umask, sp_model, corpus_dir):
    out = _tokenize(tmp_path, sp_model, corpus_dir, "--file-mode", "0640")
    modes = _tree_modes(out)
    assert any(p.endswith(".idx") for p in modes) and any(p.endswith(".bin") for p in modes)
    assert {p: f"{m:04o}" for p, m in modes.items() if m != (0o750 if p.endswith("/") else 0o640)} == {}


@pytest.mark.multiproc
def test_tokenize_without_a_file_mode_keeps_todays_modes(tmp_path, umask, sp_model, corpus_dir):
    out = _tokenize(tmp_path, sp_model, corpus_dir)
    modes = _tree_modes(out)
    assert {p: f"{m:04o}" for p, m in modes.items() if m != (0o755 if p.endswith("/") else 0o644)} == {}


@pytest.mark.unit
def test_fix_tree_sets_the_mode_keeps_setgid_and_never_follows_a_link(tmp_path, umask):
    d = tmp_path / "ckpt"
    (d / "tag").mkdir(parents=True)
    os.chmod(d, 0o2775)  # a group project directory: setgid, group-writable
    (d / "tag" / "model.pt").write_bytes(b"x")
    os.chmod(d / "tag" / "model.pt", 0o644)
    script = d / "zero_to_fp32.py"
    script.write_text("#")
    os.chmod(script, 0o755)
    outside = tmp_path / "elsewhere"
    outside.write_text("not ours")
    os.chmod(outside, 0o644)
    (d / "tag" / "link").symlink_to(outside)
    file_modes.fix_tree(d, 0o640)
    assert (_mode(d), _mode(d / "tag"), _mode(d / "tag" / "model.pt"), _mode(script)) == (0o2750, 0o750, 0o640, 0o750)
    assert _mode(outside) == 0o644
    assert file_modes.fix_tree(d) is None and _mode(d / "tag" / "model.pt") == 0o640  # no mode set: nothing changes


@pytest.mark.multiproc
def test_ray_workers_write_with_the_file_mode(tmp_path, umask, sp_model, corpus_dir):
    """The shards come from Ray's worker processes (started by the raylet, each given the mode with its task)."""
    out = _tokenize(tmp_path, sp_model, corpus_dir, "--executor", "ray", "--file-mode", "0600")
    modes = _tree_modes(out)
    assert any(p.endswith(".idx") for p in modes)
    assert {p: f"{m:04o}" for p, m in modes.items() if m != (0o700 if p.endswith("/") else 0o600)} == {}

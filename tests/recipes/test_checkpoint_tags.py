"""A checkpoint tag reaches a path: `--tag` and the `latest` file name a directory inside the checkpoint directory, and
only plain tag names are accepted (recipes.checkpoint.format.tags). A `latest` planted to point elsewhere (a copied
or shared checkpoint directory) or a `--tag ../x` is refused naming where it came from, before anything is read;
the refusal reaches the user as one line and exit 2."""
from __future__ import annotations

import json

import pytest

from recipes.checkpoint.format.errors import CheckpointError
from recipes.checkpoint.format.tags import MARKER, check_tag_name, resolve_tag

pytestmark = pytest.mark.unit


def _complete_tag(d):
    """A directory that passes the completeness check (complete.json listing no files)."""
    d.mkdir(parents=True)
    (d / MARKER).write_text(json.dumps({"step": 2, "client_state": {}, "files": {}}))
    return d


@pytest.fixture
def dirs(tmp_path):
    ckpt = tmp_path / "ckpt"
    _complete_tag(ckpt / "global_step2")
    _complete_tag(tmp_path / "elsewhere")  # outside the checkpoint directory, looks complete
    return ckpt


def test_plain_tags_are_read(dirs):
    (dirs / "latest").write_text("global_step2\n")
    assert resolve_tag(dirs) == dirs / "global_step2"
    assert resolve_tag(dirs, "global_step2") == dirs / "global_step2"
    for name in ("global_step123", "best", "run-1.final", "step_7"):
        assert check_tag_name(name, "--tag") == name


@pytest.mark.parametrize("planted", ["../elsewhere", "/tmp", "..", "global_step2/../../elsewhere", "."])
def test_latest_pointing_outside_is_refused(dirs, planted):
    (dirs / "latest").write_text(planted)
    with pytest.raises(CheckpointError, match=r"latest: .* is not a checkpoint tag name"):
        resolve_tag(dirs)


@pytest.mark.parametrize("tag", ["../elsewhere", "a/b", "..", ".hidden", "x\ny", ""])
def test_tag_option_outside_is_refused(dirs, tag):
    with pytest.raises(CheckpointError, match=r"--tag: .* is not a checkpoint tag name"):
        resolve_tag(dirs, tag)


def test_cli_refuses_with_one_line_and_exit_2(dirs, capsys):
    from recipes.tools.reshape import main

    code = main(["--checkpoint", str(dirs), "--tag", "../elsewhere", "--out", str(dirs.parent / "out"), "--to",
                 "tp=1,pp=1,dp=1", "--config", "configs/runs/tiny-cpu.yaml"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: --tag: '../elsewhere' is not a checkpoint tag name") and err.count("\n") == 1, err
    assert not (dirs.parent / "out").exists()

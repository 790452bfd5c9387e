"""import-hf given a path of the wrong kind says what it is and what to give (issue 42 item 3): a missing local folder
used to be reported by transformers as a malformed hub repo id, a file as invalid JSON, a folder without config.json
as a traceback. Nothing is downloaded and nothing is written; the checks run before the model is read."""
from __future__ import annotations

import pytest

from recipes.hf.importer import main as import_main

pytestmark = pytest.mark.unit

RECIPE = "configs/runs/tiny-cpu.yaml"


@pytest.mark.parametrize("make, said", [
    (lambda d: d / "no-such-model", "--hf {p}: no such directory; give a local transformers model directory (the "
                                    "config.json and weights save_pretrained writes; nothing is downloaded)"),
    (lambda d: (d / "tok.model").write_text("") or d / "tok.model",
     "--hf {p} is a file; give the model's directory (holding config.json and the weights)"),
    (lambda d: (d / "empty").mkdir() or d / "empty",
     "--hf {p} has no config.json: not a transformers model directory (give the directory save_pretrained wrote)"),
], ids=["missing", "a-file", "no-config"])
def test_hf_paths_of_the_wrong_kind(make, said, tmp_path, capsys):
    p = make(tmp_path)
    assert import_main(["--hf", str(p), "--out", str(tmp_path / "ck"), "--config", RECIPE, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {said.format(p=p)}\n", err
    assert not (tmp_path / "ck").exists()


def test_an_out_that_is_a_file_is_refused_first(tmp_path, capsys):
    out = tmp_path / "ck"
    out.write_text("keep me")
    assert import_main(["--hf", str(tmp_path / "nothing"), "--out", str(out), "--config", RECIPE, "--quiet"]) == 2
    assert capsys.readouterr().err == f"error: --out {out} is a file; give a new directory for the checkpoint\n"
    assert out.read_text() == "keep me"

"""Bad input: a clear error naming the problem and the fix, and nothing written that looks like a finished export."""
from __future__ import annotations

import json
import shutil

import pytest

from interop_runs import RECIPE
from recipes.hf.export import main as export_main
from recipes.hf.importer import main as import_main

pytestmark = pytest.mark.multiproc


def _copy(run, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(run.path, dst, ignore=shutil.ignore_patterns("logs", "data_cache"))
    return dst


def _export(ckpt, out, run, capsys, *extra):
    code = export_main(["--checkpoint", str(ckpt), "--out", str(out), "--quiet", "--config", run.config,
                        *run.overrides, *extra])
    return code, capsys.readouterr().err


def _nothing_written(out):
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    return not out.exists() and not leftovers


def test_missing_latest(llama_111, tmp_path, capsys):
    ckpt = _copy(llama_111, tmp_path)
    (ckpt / "latest").unlink()
    out = tmp_path / "hf"
    code, err = _export(ckpt, out, llama_111, capsys)
    assert code == 2 and "no `latest` file" in err and "--tag global_step6" in err, err
    assert _nothing_written(out)
    code, err = _export(ckpt, out, llama_111, capsys, "--tag", "global_step6")  # the advertised fix works
    assert code == 0 and (out / "config.json").is_file(), err


def test_truncated_weight_file(llama_111, tmp_path, capsys):
    ckpt = _copy(llama_111, tmp_path)
    victim = ckpt / "global_step6" / "mp_rank_00_model_states.pt"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    out = tmp_path / "hf"
    code, err = _export(ckpt, out, llama_111, capsys)
    assert code == 2 and "mp_rank_00_model_states.pt" in err and "incomplete or damaged" in err, err
    assert _nothing_written(out)

    # a damaged file whose size matches the save record (complete.json updated): torch cannot read it
    marker = ckpt / "global_step6" / "complete.json"
    record = json.loads(marker.read_text())
    record["files"]["mp_rank_00_model_states.pt"] = victim.stat().st_size
    marker.write_text(json.dumps(record))
    code, err = _export(ckpt, out, llama_111, capsys)
    assert code == 2 and "mp_rank_00_model_states.pt: cannot be read" in err, err
    assert _nothing_written(out)


def test_unsupported_architecture(llama_111, tmp_path, capsys):
    out = tmp_path / "hf"
    code, err = _export(llama_111.path, out, llama_111, capsys, "model.normalization=layernorm")
    assert code == 2 and "model.normalization=layernorm" in err and "Llama" in err, err
    assert _nothing_written(out)


def test_import_refuses_unsupported_rope(llama_111, corpus, tmp_path, capsys):
    hf_dir = tmp_path / "hf"
    code, err = _export(llama_111.path, hf_dir, llama_111, capsys)
    assert code == 0, err
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "imported"
    code = import_main(["--hf", str(hf_dir), "--out", str(out), "--config", RECIPE, "--quiet",
                        f"data.manifests=[{corpus['manifest']}]"])
    err = capsys.readouterr().err
    assert code == 2 and "rope_type=linear" in err, err
    assert _nothing_written(out)

"""A checkpoint written by DeepSpeed's pipeline engine (the project's training path before format 2: per-layer files,
the tied embedding as `tied_modules.embed`), kept in tests/assets with what the old code measured on it
(tests/assets/make_deepspeed_pipe_checkpoint.py), is read by today's readers: its tensors are the ones the old code
read, `recipes train` resumes it (resharded on load into today's engine) with the old code's following losses,
`export-hf` exports it and `reshape` re-lays it.
"""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.assets.make_deepspeed_pipe_checkpoint import corpus_digest
from tests.support.corpus import write_corpus
from tests.support.runs import REPO, losses, pretrain, recipes_cli

pytestmark = pytest.mark.multiproc

ASSET = REPO / "tests" / "assets" / "deepspeed_pipe_checkpoint.tar.xz"


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    root = tmp_path_factory.mktemp("old_format")
    with tarfile.open(ASSET) as tar:
        tar.extractall(root, filter="data")
    ckpt = root / "deepspeed_pipe_checkpoint"
    expected = json.loads((ckpt / "expected.json").read_text())
    manifest = write_corpus(root / "corpus")
    assert corpus_digest(manifest) == expected["corpus_sha256"], "the test corpus (this Python's stdlib sources) " \
        "is not the one the asset's losses were measured on"
    overrides = [f"data.manifests=[{manifest}]", "training.eval_interval=1000", "logging.tensorboard=false",
                 *expected["overrides"]]
    return ckpt, expected, overrides


def _copy(ckpt: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(ckpt, to)
    return to


def _stats_match(state: dict, expected: dict, rel: float) -> None:
    assert sorted(state) == sorted(expected)
    for name, (total, norm) in expected.items():
        t = state[name].double()
        assert abs(float(t.norm()) - norm) <= rel * max(abs(norm), 1e-12), name
        assert abs(float(t.sum()) - total) <= rel * max(float(t.abs().sum()), 1e-12), name


def test_offline_reader_reads_what_the_old_code_read(old):
    from recipes.checkpoint.format.read import read_full_state
    from recipes.checkpoint.recipe_file import load_checkpoint_recipe

    ckpt, expected, _ = old
    state = read_full_state(ckpt, load_checkpoint_recipe(str(ckpt), None, []).model, with_moments=True)
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        _stats_match(getattr(state, part), expected[part], 1e-7)


@pytest.mark.parametrize("layout,ranks,rel", [("saved", 4, 1e-6), ("tp1-pp1", 1, 1e-5),
                                               ("pp2-vpp2-dp2", 4, 1e-5)])
def test_train_resumes_it_with_the_old_codes_losses(old, tmp_path, layout, ranks, rel):
    ckpt, expected, overrides = old
    run = _copy(ckpt, tmp_path / "ckpt")
    extra = {"saved": [], "tp1-pp1": ["parallel.tp=1", "parallel.pp=1"],
             "pp2-vpp2-dp2": ["parallel.tp=1", "parallel.pp=2", "parallel.vpp=2"]}[layout]
    out = pretrain(ranks, *overrides, f"checkpoint.dir={run}", "training.train_steps=4", *extra, timeout=600)
    assert "resharding it on load" in out.stdout + out.stderr
    got = losses(run)
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        want = expected["losses"][str(step)]
        assert abs(got[step] - want) <= rel * want, (layout, got, expected["losses"])
    before = {p.name: p.stat().st_size for p in (ckpt / "global_step2").iterdir()}
    assert {p.name: p.stat().st_size for p in (run / "global_step2").iterdir()} == before  # only read


def test_export_and_reshape_read_it(old, tmp_path):
    from safetensors.torch import load_file

    ckpt, expected, _ = old
    r = recipes_cli(["export-hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf"), "--quiet"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    exported = {k: v for f in (tmp_path / "hf").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    embed = exported["model.embed_tokens.weight"].double()
    assert abs(float(embed.norm()) - expected["weights"]["0.word_embeddings.weight"][1]) < 1e-5
    r = recipes_cli(["reshape", "--checkpoint", str(ckpt), "--out", str(tmp_path / "re"), "--to",
                     "tp=1,pp=2,dp=1,vpp=2", "--quiet"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    from recipes.checkpoint.format.read import read_full_state
    from recipes.checkpoint.recipe_file import load_checkpoint_recipe

    state = read_full_state(tmp_path / "re", load_checkpoint_recipe(str(tmp_path / "re"), None, []).model,
                            with_moments=True)
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        _stats_match(getattr(state, part), expected[part], 1e-7)

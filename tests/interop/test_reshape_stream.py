"""Streaming reshape (recipes.checkpoint.format.relayout: tensor by tensor, worker processes over (stage, TP rank) items) of
the TP=2 x PP=2 x DP=2 step-3 checkpoint to 4 ranks (TP=2 x PP=1 x DP=2: pipeline merged, half the ranks gone) and to
16 ranks (TP=2 x PP=2 x DP=4), untied and tied (the word embedding on the first and the last stage).

References computed another way:
  * files: the engine writer (recipes.train.state_writer: a DeepSpeed engine per target rank, DeepSpeed's own save)
    writes the same target; every tensor, every ZeRO partition, padding and fragment map must be identical;
  * losses: the uninterrupted 8-rank run's steps 4..6; the runs resumed from the streamed checkpoints must match them
    to the reduction-order tolerance of tests/interop/test_reshape.py (a wrong partition, moment or step moves a loss
    by > 1e-3);
  * workers: one worker writes the same bytes as several.
"""
from __future__ import annotations

import json

import pytest
import torch

from recipes.checkpoint import safe_load
from recipes.checkpoint.format import checksums
from recipes.checkpoint.format.read import read_full_state
from recipes.tools.reshape import parse_target, reshape
from tests.support.runs import losses, pretrain, recipes_cli

pytestmark = pytest.mark.multiproc

REL_TOL = 2e-5


def _reshape(run, tmp_path_factory, target: str, writer: str = "stream", workers: int | None = None):
    out = tmp_path_factory.mktemp("reshape_stream") / target.replace(",", "_").replace("=", "")
    if writer == "engine":  # the command as users run it, forked from the tests' template: its engine ranks too
        r = recipes_cli(["reshape", "--checkpoint", str(run.path), "--out", str(out), "--to", target, "--tag",
                         "global_step3", "--writer", "engine", "--quiet"], timeout=900)
        assert r.returncode == 0, r.stderr[-4000:]
        return out
    reshape(str(run.path), str(out), run.recipe(), parse_target(target), tag="global_step3", quiet=True, writer=writer,
            workers=workers)
    return out


@pytest.fixture(scope="module")
def to_4(llama_222, tmp_path_factory):
    return _reshape(llama_222, tmp_path_factory, "tp=2,pp=1,dp=2")


@pytest.fixture(scope="module")
def to_16(llama_222, tmp_path_factory):
    return _reshape(llama_222, tmp_path_factory, "tp=2,pp=2,dp=4")


def _same(a, b, where: str) -> None:
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert str(a) == str(b), f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def tied_to_4(llama_222_tied, tmp_path_factory):
    return _reshape(llama_222_tied, tmp_path_factory, "tp=2,pp=1,dp=2", writer="auto")


@pytest.fixture(scope="module")
def tied_to_16(llama_222_tied, tmp_path_factory):
    return _reshape(llama_222_tied, tmp_path_factory, "tp=2,pp=2,dp=4", writer="auto", workers=4)


def _same_files(run, ours_dir, tmp_path_factory, target: str) -> None:
    engine = _reshape(run, tmp_path_factory, target, writer="engine")
    ours, theirs = ours_dir / "global_step3", engine / "global_step3"
    names = sorted(p.name for p in theirs.glob("*.pt") if not p.name.startswith("rng_"))
    assert names == sorted(p.name for p in ours.glob("*.pt")), "a different set of DeepSpeed files"
    for name in names:
        a, b = safe_load.load(ours / name), safe_load.load(theirs / name)
        # The engine writer's fresh engine counts its own steps from 0; the streamed file carries the source's.
        for k in ("global_steps", "global_samples", "ds_config"):
            a.pop(k, None), b.pop(k, None)
        _same(a, b, name)


def test_files_equal_the_engine_writers(llama_222, to_4, tmp_path_factory):
    _same_files(llama_222, to_4, tmp_path_factory, "tp=2,pp=1,dp=2")


def test_tied_files_equal_the_engine_writers(llama_222_tied, tied_to_4, tmp_path_factory):
    _same_files(llama_222_tied, tied_to_4, tmp_path_factory, "tp=2,pp=1,dp=2")


def test_tied_pipeline_files_equal_the_engine_writers(llama_222_tied, tmp_path_factory):
    # PP > 1 target: the word embedding first in the first stage's groups, and its copy (the head) first in the last's
    ours = _reshape(llama_222_tied, tmp_path_factory, "tp=2,pp=2,dp=1", writer="auto")
    _same_files(llama_222_tied, ours, tmp_path_factory, "tp=2,pp=2,dp=1")


def test_one_worker_writes_the_same_bytes_as_four(llama_222_tied, tied_to_16, tmp_path_factory):
    one = _reshape(llama_222_tied, tmp_path_factory, "tp=2,pp=2,dp=4", workers=1)
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tied_to_16) for p in tied_to_16.rglob("*") if p.is_file())
    assert len(files) > 20  # 4 model-states, 16 optimizer and 16 RNG files, complete.json, recipe, scripts
    for f in files:
        assert (one / f).read_bytes() == (tied_to_16 / f).read_bytes(), f


def test_optimizer_state_preserved_at_16(llama_222, to_16):
    model_cfg = llama_222.recipe().model
    before = read_full_state(llama_222.path, model_cfg, tag="global_step3", with_moments=True)
    after = read_full_state(to_16, model_cfg, with_moments=True)
    assert (after.meta["source_layout"]["tp"], after.meta["source_layout"]["pp"],
            after.meta["source_layout"]["dp"]) == (2, 2, 4)
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        a, b = getattr(before, part), getattr(after, part)
        assert list(a) == list(b)
        for k in a:
            assert torch.equal(a[k], b[k]), (part, k)
    assert after.meta["optimizer_step"] == before.meta["optimizer_step"] == 3


def _continue(llama_222, ckpt, n, *layout):
    # All three steps of the 6-step schedule: fewer steps would change the lr schedule and the data order.
    ref = losses(llama_222.path)
    pretrain(n, *llama_222.overrides, f"checkpoint.dir={ckpt}", *layout, config=llama_222.config, timeout=600)
    got = losses(ckpt)
    assert sorted(got) == [4, 5, 6], f"the reshaped run did not resume at step 4: {got}"
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
    assert worst <= REL_TOL, f"losses after reshape {got} vs uninterrupted {ref} (worst rel. diff {worst:.2e})"


def test_8_to_4_ranks_losses_continue(llama_222, to_4):
    _continue(llama_222, to_4, 4, "parallel.tp=2", "parallel.pp=1")


def test_8_to_16_ranks_losses_continue(llama_222, to_16):
    _continue(llama_222, to_16, 16, "parallel.tp=2", "parallel.pp=2")


def test_tied_8_to_4_ranks_losses_continue(llama_222_tied, tied_to_4):
    _continue(llama_222_tied, tied_to_4, 4, "parallel.tp=2", "parallel.pp=1")


def test_tied_8_to_16_ranks_losses_continue(llama_222_tied, tied_to_16):
    _continue(llama_222_tied, tied_to_16, 16, "parallel.tp=2", "parallel.pp=2")


def test_every_file_written_has_its_checksum_recorded(tied_to_16):
    tag = tied_to_16 / "global_step3"
    recorded = {}
    for record in tag.glob("checksums_*.json"):
        recorded.update(json.loads(record.read_text()))
    written = {p.name for p in tag.glob("*.pt")}  # 4 model-states and 16 optimizer files
    assert len(written) == 20 and set(recorded) == written, set(recorded) ^ written
    assert all(checksums.digest(tag / n) == d for n, d in recorded.items())

"""A checkpoint is data: a pickle payload planted in a DeepSpeed model-states file or in an RNG file makes export,
reshape and resume stop with an error naming the file, and the payload never runs.

The payload is what an attacker would ship: an object whose `__reduce__` calls `open(X, "w")` (any callable would
do), saved with torch.save into a real checkpoint of a real 2-rank run, with complete.json's sizes updated so the
tag still looks complete. With `torch.load(weights_only=False)` each of these commands creates X.
"""
from __future__ import annotations

import shutil

import pytest

from interop_runs import RECIPE, run_overrides
from tests.support import tamper
from tests.support.runs import pretrain, recipes_cli
from recipes.checkpoint import safe_load

pytestmark = pytest.mark.multiproc

TAG = "global_step2"


class Payload:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory, corpus):
    run_dir = tmp_path_factory.mktemp("victim") / "ckpt"
    overrides = run_overrides(corpus, run_dir) + ["parallel.tp=2", "training.train_steps=2",
                                                  "checkpoint.save_interval=2"]
    pretrain(2, *overrides, config=RECIPE, timeout=400)
    return run_dir, overrides


def _plant(ckpt_dir, name, marker):
    tamper.plant(ckpt_dir / TAG, name, Payload(marker))  # the tag still looks complete, its checksums match


def _refused(proc, name, marker):
    out = proc.stdout + proc.stderr
    assert not marker.exists(), f"the payload ran: {marker} was created\n{out[-3000:]}"
    assert proc.returncode != 0, out[-3000:]
    assert name in out and "refused to load" in out, out[-3000:]


@pytest.mark.parametrize("name", ["mp_rank_00_model_states.pt", "rng_rank1.pt"])
def test_resume_refuses_payload(clean_run, tmp_path, name):
    src, overrides = clean_run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(src, ckpt)
    marker = tmp_path / "pwned"
    _plant(ckpt, name, marker)
    ov = [o for o in overrides if not o.startswith("checkpoint.dir=")] + [f"checkpoint.dir={ckpt}"]
    proc = recipes_cli(["train", "--config", RECIPE, "--local", "2", "--quiet", *ov])
    _refused(proc, name, marker)


@pytest.mark.parametrize("tool", ["export_hf", "reshape"])
def test_tools_refuse_payload(clean_run, tmp_path, tool):
    src, _ = clean_run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(src, ckpt)
    marker = tmp_path / "pwned"
    name = "mp_rank_00_model_states.pt"
    _plant(ckpt, name, marker)
    extra = ["--to", "tp=1,pp=1,dp=1"] if tool == "reshape" else []
    command = {"export_hf": "export-hf", "reshape": "reshape"}[tool]
    proc = recipes_cli([command, "--checkpoint", str(ckpt), "--out", str(tmp_path / "out"), "--quiet", *extra])
    _refused(proc, name, marker)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_clean_checkpoint_loads_with_allow_list(clean_run):
    # every file DeepSpeed and we wrote reads back under weights_only=True (the allow-list is enough, not too small)
    src, _ = clean_run
    files = sorted((src / TAG).glob("*.pt"))
    assert any(f.name.startswith("zero_pp_rank") for f in files) and any(f.name.startswith("rng_") for f in files)
    for f in files:
        safe_load.load(f)

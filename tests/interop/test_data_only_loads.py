"""No loader of ours or of a library ever unpickles code (round 4 of the security read: an MoE checkpoint ran a shell
command inside rank 1 of `export-hf`, through DeepSpeed's default checkpoint engine). torch.load of every process of
the project is weights-only with the allow-list from the moment torch is imported (recipes.torch_guard), so:

- every file of every checkpoint kind the project writes (dense TP x DP, a pipeline at PP x VPP, MoE at EP, the RNG
  files, the optimizer partitions, a checkpoint of DeepSpeed's pipeline engine) is refused, naming the file, when a
  payload is planted in it: one file at a time, read as DeepSpeed reads them (torch.load with weights_only=False);
- every reader (resume, export-hf, evaluate --checkpoint, reshape, init_from; export-hf and reshape of an expert-
  parallel run read through engines, recipes.train.state_reader) refuses a payload planted in a file other than the
  first one it reads (the old pre-check safe-loaded only the first model and optimizer files), and it never runs.

The payload is what an attacker would ship: an object whose `__reduce__` calls `open(X, "w")`, saved with torch.save
into a real checkpoint, complete.json's sizes and the checksum records updated so the tag still looks whole.

The same readers refuse a file a disk damaged (16 KiB zeroed in place, the size unchanged), naming it, before they use
it: every file a save writes has its checksum recorded as it is written (recipes.checkpoint.format.checksums).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

from interop_runs import RECIPE, run_overrides
from recipes.checkpoint import safe_load
from recipes.checkpoint.format import checksums
from tests.support import tamper
from tests.support.runs import REPO, pretrain, recipes_cli

pytestmark = pytest.mark.multiproc

TAG = "global_step2"
MOE = ["model.moe.num_experts=4", "model.moe.top_k=2"]
KINDS = {  # name: (ranks, overrides)
    "dense-tp2-dp2-zero1": (4, ["parallel.tp=2"]),
    "pipeline-pp2-vpp2-dp2": (4, ["parallel.pp=2", "parallel.vpp=2"]),
    "moe-ep2-dp2": (2, [*MOE, "parallel.ep=2"]),
}


class Payload:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    made = {}
    for name, (n, extra) in KINDS.items():
        run_dir = tmp_path_factory.mktemp(name) / "ckpt"
        overrides = run_overrides(corpus, run_dir) + ["training.train_steps=2", "checkpoint.save_interval=2", *extra]
        pretrain(n, *overrides, config=RECIPE, timeout=600)
        made[name] = (run_dir, overrides, n)
    return made


def _plant(ckpt_dir, name, marker):
    tamper.plant(ckpt_dir / TAG, name, Payload(marker))  # the tag still looks complete, its checksums match


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_every_file_of_every_kind_is_refused_naming_it(runs, tmp_path):
    old = tmp_path / "old"
    with tarfile.open(REPO / "tests/assets/deepspeed_pipe_checkpoint.tar.xz") as tar:
        tar.extractall(old, filter="data")
    tags = {name: run_dir / TAG for name, (run_dir, _, _) in runs.items()}
    tags["deepspeed-pipeline-engine"] = old / "deepspeed_pipe_checkpoint" / TAG
    checked = 0
    for kind, tag in tags.items():
        for f in sorted(tag.glob("*.pt")):
            planted = tmp_path / kind / f.name
            planted.parent.mkdir(parents=True, exist_ok=True)
            marker = tmp_path / f"pwned-{kind}-{f.name}"
            state = safe_load.load(f, legacy_rng=True)
            state["extra"] = Payload(marker)
            torch.save(state, planted)
            # as DeepSpeed's TorchCheckpointEngine reads a file (this test process imported recipes first)
            with pytest.raises(safe_load.UnsafeCheckpointError, match=f"{planted}: refused to load"):
                torch.load(planted, map_location="cpu", weights_only=False)
            assert not marker.exists(), f"{kind}/{f.name}: the payload ran"
            checked += 1
    assert checked >= 30, checked


def _refused(proc, name, marker):
    out = proc.stdout + proc.stderr
    assert not marker.exists(), f"the payload ran: {marker} was created\n{out[-3000:]}"
    assert proc.returncode != 0, out[-3000:]
    assert name in out and "refused to load" in out, out[-3000:]


READERS = {  # reader: (kind, the file planted: never the first one the reader opens)
    "resume-pipeline": ("pipeline-pp2-vpp2-dp2", "mp_rank_01_model_states.pt"),
    "resume-optimizer-partition": ("dense-tp2-dp2-zero1", "zero_pp_rank_1_mp_rank_01_optim_states.pt"),
    "resume-rng": ("pipeline-pp2-vpp2-dp2", "rng_rank3.pt"),
    "export-hf-experts": ("moe-ep2-dp2", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    "reshape-experts": ("moe-ep2-dp2", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    "evaluate-checkpoint": ("dense-tp2-dp2-zero1", "mp_rank_01_model_states.pt"),
    "init-from": ("pipeline-pp2-vpp2-dp2", "zero_pp_rank_1_mp_rank_01_optim_states.pt"),
}


def _read(reader, runs, ckpt, tmp_path):
    """Run `reader` (READERS) on the checkpoint directory `ckpt` (a copy of a run of its kind)."""
    src, overrides, n = runs[READERS[reader][0]]
    ov = [o for o in overrides if not o.startswith("checkpoint.dir=")]
    if reader.startswith("resume"):
        return recipes_cli(["train", "--config", RECIPE, "--local", str(n), "--quiet", *ov,
                            f"checkpoint.dir={ckpt}", "training.train_steps=3"], timeout=600)
    if reader.startswith("export-hf"):
        return recipes_cli(["export-hf", "--checkpoint", str(ckpt), "--out", str(tmp_path / "out"), "--quiet"],
                           timeout=600)
    if reader.startswith("reshape"):
        return recipes_cli(["reshape", "--checkpoint", str(ckpt), "--out", str(tmp_path / "out"), "--to",
                            "tp=1,pp=1,dp=1,ep=1", "--quiet"], timeout=600)
    if reader == "evaluate-checkpoint":
        return subprocess.run([sys.executable, "-m", "recipes", "evaluate", "--checkpoint", str(ckpt), "--tasks",
                               "recipes_ppl", "--limit", "2", "--quiet"], cwd=REPO, capture_output=True, text=True,
                              timeout=900)
    # init_from: a new run starting from the checkpoint, at another layout
    return recipes_cli(["train", "--config", RECIPE, "--local", "2", "--quiet", *ov, "parallel.vpp=1",
                        f"checkpoint.dir={tmp_path / 'new'}", f"checkpoint.init_from.dir={ckpt}",
                        "checkpoint.init_from.optimizer=true", "training.train_steps=1"], timeout=600)


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_payload_in_a_later_file(runs, tmp_path, reader):
    kind, name = READERS[reader]
    ckpt = _copy(runs[kind][0], tmp_path)
    marker = tmp_path / "pwned"
    _plant(ckpt, name, marker)
    _refused(_read(reader, runs, ckpt, tmp_path), name, marker)


def test_every_file_of_a_save_has_its_checksum_recorded(runs):
    for kind, (run_dir, _, _) in runs.items():
        tag = run_dir / TAG
        recorded = {}
        for record in tag.glob(f"{checksums.PREFIX}*{checksums.SUFFIX}"):
            recorded.update(json.loads(record.read_text()))
        files = {f.name for f in tag.glob("*.pt")}
        assert files and set(recorded) == files, (kind, files ^ set(recorded))
        for name, want in recorded.items():
            assert checksums.digest(tag / name) == want, (kind, name)


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_damaged_file_naming_it(runs, tmp_path, reader):
    """16 KiB zeroed in place (same size: complete.json still vouches for it), in a file the reader opens after
    others: refused before a byte of it is used, naming it, and nothing written from it."""
    kind, name = READERS[reader]
    ckpt = _copy(runs[kind][0], tmp_path)
    tamper.damage(ckpt / TAG / name)
    proc = _read(reader, runs, ckpt, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"{name}: its content is not what was written" in out, out[-3000:]
    assert not (tmp_path / "out" / "model.safetensors").exists() and not (tmp_path / "new" / "latest").exists()

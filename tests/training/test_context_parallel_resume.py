"""Checkpoints of a context-parallel run: bitwise kill/resume at CP=2, and CP has no parameters of its own.

The run: CP=2 x PP=2 (4 ranks, ZeRO-1) over two data stages (the stdlib corpus, then 4 steps of short documents with
an lr anneal), saving every 2 steps.
  * SIGKILL after step 5, auto-resume from step 4: every loss equals the uninterrupted run's, bit for bit.
  * The step-4 checkpoint resumed at CP=1 x PP=2 x DP=2 as it is (no conversion): DeepSpeed's data axis is DP x CP,
    so a CP=2 x DP=1 run writes the files a CP=1 x DP=2 run reads. Its losses continue the CP=2 run's, and its step-8
    checkpoint has the same files, the same tensors and (up to the order of additions) the same values as the CP=2
    run's step 8: nothing in a checkpoint belongs to CP.
  * The step-4 checkpoint reshaped to TP=2 x PP=1 (`recipes reshape`, which reads the CP run as DP x CP) continues
    with the same losses.
Tolerance for the runs at another layout: 1e-5 relative, as in test_sequence_context_parallel.py (observed ~1e-7).
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from recipes.checkpoint.format.read import read_full_state
from recipes.config.loading import load_recipe
from recipes.tools.reshape import parse_target, reshape
from tests.support.runs import RECIPE, REPO, losses, pretrain, pretrain_cmd, wait_for_step, worker_env, kill_group

pytestmark = pytest.mark.multiproc

STEPS, N = 8, 4
REL_TOL = 1e-5
CP_LAYOUT = ["parallel.cp=2", "parallel.pp=2", "parallel.zero_stage=1"]


def _run(corpus, docs) -> list[str]:
    return [f"data.manifests=[{corpus}]", f"training.train_steps={STEPS}", "training.schedule.decay=constant",
            "checkpoint.save_interval=2", "checkpoint.keep_last=4",
            f"data.stages=[{{name: main}}, {{name: docs, steps: 4, manifests: [{docs}], lr: {{end_lr: 0.0}}}}]"]


@pytest.fixture(scope="module")
def uninterrupted(corpus, short_doc_corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cp2_pp2")
    pretrain(N, *_run(corpus, short_doc_corpus), *CP_LAYOUT, f"checkpoint.dir={run_dir}", timeout=600)
    return run_dir


def _worst(ref: dict, got: dict) -> float:
    return max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)


def test_sigkill_then_auto_resume_is_bitwise_equal(uninterrupted, corpus, short_doc_corpus, tmp_path):
    args = (*_run(corpus, short_doc_corpus), *CP_LAYOUT, f"checkpoint.dir={tmp_path}")
    proc = subprocess.Popen(pretrain_cmd(N, *args, "checkpoint.async_save=false"), cwd=REPO, env=worker_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_step(tmp_path / "logs" / "metrics.jsonl", 5, proc, timeout=600)
    finally:
        kill_group(proc)  # launcher and every rank, no chance to save
    assert max(losses(tmp_path)) < STEPS
    assert (tmp_path / "latest").read_text().strip() == "global_step4"

    resumed = pretrain(N, *args, timeout=600)
    assert f"resumed from {tmp_path / 'global_step4'}" in resumed.stdout + resumed.stderr
    ref, got = losses(uninterrupted), losses(tmp_path)
    assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]


def _from_step4(source, target):
    """A copy of `source` as it was after step 4: its step-4 checkpoint, no later ones, no metrics."""
    shutil.copytree(source, target)
    for later in ("global_step6", "global_step8"):
        shutil.rmtree(target / later)
    (target / "latest").write_text("global_step4")
    (target / "logs" / "metrics.jsonl").unlink()


def test_cp2_checkpoint_resumes_at_cp1_and_holds_no_cp_state(uninterrupted, corpus, short_doc_corpus, tmp_path):
    run_dir = tmp_path / "cp1_dp2"
    _from_step4(uninterrupted, run_dir)
    out = pretrain(N, *_run(corpus, short_doc_corpus), "parallel.cp=1", "parallel.pp=2", "parallel.zero_stage=1",
                   f"checkpoint.dir={run_dir}", timeout=600)
    assert f"resumed from {run_dir / 'global_step4'}" in out.stdout + out.stderr
    got = losses(run_dir)
    assert sorted(got) == [5, 6, 7, 8]
    assert _worst(losses(uninterrupted), got) <= REL_TOL, (got, losses(uninterrupted))

    # The CP=1 x DP=2 run's step-8 checkpoint against the CP=2 x DP=1 run's: same files, same tensors.
    cp2, cp1 = uninterrupted / "global_step8", run_dir / "global_step8"
    assert sorted(p.name for p in cp1.iterdir()) == sorted(p.name for p in cp2.iterdir())
    model_cfg = load_recipe(RECIPE, []).model
    a = read_full_state(uninterrupted, model_cfg, tag="global_step8", with_moments=True)
    b = read_full_state(run_dir, model_cfg, tag="global_step8", with_moments=True)
    assert a.meta["source_layout"] == b.meta["source_layout"]
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        x, y = getattr(a, part), getattr(b, part)
        assert sorted(x) == sorted(y) and all(x[k].shape == y[k].shape for k in x), part
        for k in x:
            torch.testing.assert_close(y[k], x[k], rtol=1e-4, atol=1e-7, msg=f"{part} {k}")
    assert a.meta["optimizer_step"] == b.meta["optimizer_step"] == STEPS


def test_cp2_checkpoint_resumes_at_cp1_dp1_by_resharding_on_load(uninterrupted, corpus, short_doc_corpus, tmp_path):
    """CP=2 x PP=2 (data axis 2) resumed on 2 ranks at CP=1 x PP=2 (data axis 1): ZeRO's partitions do not load as
    they are, so `recipes train` reshards them on load; the following losses are the uninterrupted run's."""
    run_dir = tmp_path / "cp1_dp1"
    _from_step4(uninterrupted, run_dir)
    out = pretrain(2, *_run(corpus, short_doc_corpus), "parallel.cp=1", "parallel.pp=2", "parallel.zero_stage=1",
                   f"checkpoint.dir={run_dir}", timeout=600)
    assert "resharding it on load" in out.stdout + out.stderr
    got = losses(run_dir)
    assert sorted(got) == [5, 6, 7, 8]
    assert _worst(losses(uninterrupted), got) <= REL_TOL, (got, losses(uninterrupted))


def test_cp2_checkpoint_reshaped_to_tp2_continues(uninterrupted, corpus, short_doc_corpus, tmp_path):
    overrides = [*_run(corpus, short_doc_corpus), *CP_LAYOUT]
    out = tmp_path / "tp2"
    reshape(str(uninterrupted), str(out), load_recipe(RECIPE, overrides), parse_target("tp=2,pp=1,dp=1"),
            tag="global_step4", quiet=True)
    assert load_recipe(out / "recipe.yaml", []).parallel.cp == 1
    pretrain(2, *overrides, "parallel.cp=1", "parallel.pp=1", "parallel.tp=2", f"checkpoint.dir={out}", timeout=600)
    got = losses(out)
    assert sorted(got) == [5, 6, 7, 8], got
    assert _worst(losses(uninterrupted), got) <= REL_TOL, (got, losses(uninterrupted))

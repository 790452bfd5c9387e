"""Data stages in a real run: a SIGKILL before the stage boundary and an auto-resume from the checkpoint before it
cross the boundary exactly as the uninterrupted run does (bitwise equal losses); every step is labelled with its
stage and the anneal stage's lr follows its segment; the report marks the boundary."""
from __future__ import annotations

import subprocess

import pytest

from tests.support.corpus import write_digit_corpus
from tests.support.runs import REPO, losses, pretrain, pretrain_cmd, train_records, wait_for_step, worker_env, kill_group

pytestmark = pytest.mark.multiproc

STEPS, N = 8, 2
PEAK = 3.0e-3  # tiny-cpu's lr


def _staged(run_dir, corpus, digits) -> list[str]:
    # DP=2, ZeRO-1; saves at steps 3 and 6; main takes steps 1-4, the anneal (digits corpus, linear to 0) steps 5-8.
    # Synchronous saves: the kill at step 4 must find step 3's checkpoint complete (an async save completes at a
    # later step boundary; that timing is tested in test_training_resume.py).
    return [f"checkpoint.dir={run_dir}", f"data.manifests=[{corpus}]", f"training.train_steps={STEPS}",
            "training.schedule.decay=constant", "checkpoint.save_interval=3", "checkpoint.async_save=false",
            f"data.stages=[{{name: main}}, {{name: anneal, steps: 4, manifests: [{digits}], lr: {{end_lr: 0.0}}}}]"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return write_digit_corpus(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="module")
def uninterrupted(corpus, digits, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("staged")
    pretrain(N, *_staged(run_dir, corpus, digits))
    return run_dir


def test_stages_switch_at_the_boundary_and_resume_bitwise(uninterrupted, corpus, digits, tmp_path):
    recs = {r["step"]: r for r in train_records(uninterrupted)}
    assert [recs[s]["stage"] for s in range(1, STEPS + 1)] == ["main"] * 4 + ["anneal"] * 4
    # warmup 2 steps, constant, then the anneal segment from the boundary's lr down towards 0
    assert [recs[s]["lr"] for s in range(1, STEPS + 1)] == pytest.approx(
        [PEAK / 2, PEAK, PEAK, PEAK, PEAK, 0.75 * PEAK, 0.5 * PEAK, 0.25 * PEAK])

    proc = subprocess.Popen(pretrain_cmd(N, *_staged(tmp_path, corpus, digits)), cwd=REPO, env=worker_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_step(tmp_path / "logs" / "metrics.jsonl", 4, proc)
    finally:
        kill_group(proc)
    # the resume starts before the boundary (the step-3 save), so it crosses it itself
    assert (tmp_path / "latest").read_text().strip() == "global_step3"
    out = pretrain(N, *_staged(tmp_path, corpus, digits))
    assert f"resumed from {tmp_path / 'global_step3'}" in out.stdout + out.stderr
    ref, got = losses(uninterrupted), losses(tmp_path)
    assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]

    from recipes.tools.report import write_report

    report = write_report(tmp_path / "report", metrics=tmp_path / "logs" / "metrics.jsonl").read_text()
    assert "data stages: main from step 1, anneal from step 5" in report

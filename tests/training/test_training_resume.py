"""Exact resume: SIGKILL mid-run, then auto-resume reproduces the uninterrupted run's losses bit for bit; a damaged
checkpoint is never loaded (the run falls back to the previous complete one and says so). Saves are async (the
recipe default, checkpoint.async_save) unless a test says otherwise; a crash or a stop while an async save is being
written is tested with the background write slowed down (checkpoint.async_max_mib_per_s) so it is surely in flight."""
from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.support.runs import REPO, kill_group, losses, on_corpus, pretrain, pretrain_cmd, wait_for_step, worker_env

pytestmark = pytest.mark.multiproc

STEPS = 8
# PP=2 x VPP=2 x DP=2 (ZeRO-1, the interleaved 1F1B schedule): each pipeline rank's two chunks in its files and
# DP-sharded optimizer states are both exercised.
LAYOUT = ["parallel.pp=2", "parallel.vpp=2", "parallel.zero_stage=1", "checkpoint.save_interval=2", "checkpoint.keep_last=2",
          "training.global_batch=8"]
N = 4


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    pretrain(N, *on_corpus(run_dir, corpus), f"training.train_steps={STEPS}", *LAYOUT)
    return run_dir



def test_sigkill_then_auto_resume_is_bitwise_equal(uninterrupted, corpus, tmp_path):
    """Killed with sync saves, resumed with async ones: the same losses as the uninterrupted (async) run."""
    kill_after = 5
    cmd = pretrain_cmd(N, *on_corpus(tmp_path, corpus), f"training.train_steps={STEPS}", *LAYOUT,
                       "checkpoint.async_save=false")
    proc = subprocess.Popen(cmd, cwd=REPO, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for_step(tmp_path / "logs" / "metrics.jsonl", kill_after, proc)
    finally:
        kill_group(proc)  # launcher and every rank, no chance to save
    killed_at = max(losses(tmp_path))
    assert killed_at < STEPS
    latest = (tmp_path / "latest").read_text().strip()  # never names a partial save
    assert (tmp_path / latest / "complete.json").is_file()

    resumed = pretrain(N, *on_corpus(tmp_path, corpus), f"training.train_steps={STEPS}", *LAYOUT)
    assert "resumed from" in resumed.stdout + resumed.stderr, resumed.stdout + resumed.stderr
    ref, got = losses(uninterrupted), losses(tmp_path)
    assert sorted(got) == list(range(1, STEPS + 1))
    # Bitwise: the same float for every step after the kill (and for the re-run steps before it).
    assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]


def test_checkpoint_missing_a_file_is_skipped(uninterrupted, corpus, tmp_path):
    # keep_last=2: of the saves at steps 2, 4, 6, 8 only the last two remain.
    assert sorted(p.name for p in uninterrupted.glob("global_step*")) == ["global_step6", "global_step8"]
    # Copy the finished run, then damage the newest checkpoint.
    subprocess.run(["cp", "-r", f"{uninterrupted}/.", str(tmp_path)], check=True)
    newest = tmp_path / f"global_step{STEPS}"
    victim = sorted(newest.glob("*optim_states.pt"))[0]
    victim.unlink()
    (tmp_path / "logs" / "metrics.jsonl").unlink()

    out = pretrain(N, *on_corpus(tmp_path, corpus), f"training.train_steps={STEPS}", *LAYOUT)
    assert f"skipping {newest}" in out.stdout + out.stderr and f"missing {victim.name}" in out.stdout + out.stderr, out.stdout + out.stderr
    assert f"resumed from {tmp_path / f'global_step{STEPS - 2}'}" in out.stdout + out.stderr, out.stdout + out.stderr
    ref, got = losses(uninterrupted), losses(tmp_path)
    assert sorted(got) == [STEPS - 1, STEPS]
    assert [got[s] for s in got] == [ref[s] for s in got]


SLOW_WRITE = ["checkpoint.async_save=true", "checkpoint.async_max_mib_per_s=0.1"]  # ~8 s per save and rank


def _wait_for(cond, proc, what: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        assert proc.poll() is None, f"run ended before {what}"
        time.sleep(0.02)
    raise AssertionError(f"never saw {what}")


def test_sigkill_during_an_async_save_resumes_from_the_previous_complete_one(uninterrupted, corpus, tmp_path):
    """SIGKILL every rank while the step-4 save is being written in the background: step 4 has files but no
    complete.json, `latest` names step 2, and the rerun skips step 4, resumes from step 2 and matches bit for bit."""
    cmd = pretrain_cmd(N, *on_corpus(tmp_path, corpus), f"training.train_steps={STEPS}", *LAYOUT, *SLOW_WRITE)
    proc = subprocess.Popen(cmd, cwd=REPO, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    step4 = tmp_path / "global_step4"
    try:
        # step 2's save is complete (step 4's save waited for it) and step 4's is under way
        _wait_for(lambda: (tmp_path / "global_step2" / "complete.json").is_file() and step4.is_dir()
                  and any(step4.glob("*.pt")), proc, "the step-4 save start")
        _wait_for(lambda: '"step": 5,' in (tmp_path / "logs" / "metrics.jsonl").read_text(), proc, "step 5")
    finally:
        kill_group(proc)  # launcher, every rank and their writer threads
    assert not (step4 / "complete.json").exists(), "the step-4 save finished before the kill: nothing was tested"
    assert (tmp_path / "latest").read_text().strip() == "global_step2"
    assert max(losses(tmp_path)) >= 5  # training went on while step 4 was being written

    resumed = pretrain(N, *on_corpus(tmp_path, corpus), f"training.train_steps={STEPS}", *LAYOUT)
    out = resumed.stdout + resumed.stderr
    assert f"skipping {step4}: no complete.json" in out and f"resumed from {tmp_path / 'global_step2'}" in out, out
    ref, got = losses(uninterrupted), losses(tmp_path)
    assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]
    assert sorted(p.name for p in tmp_path.glob("global_step*")) == ["global_step6", "global_step8"]  # keep_last=2


def test_preemption_waits_for_the_async_save_in_flight(uninterrupted, corpus, tmp_path):
    """SIGTERM while the step-2 save is still being written: the stop waits for it, saves the stop step too (both
    complete), exits 0, and the rerun resumes from the stop step bit for bit."""
    args = (*on_corpus(tmp_path, corpus), f"training.train_steps={STEPS}", *LAYOUT)
    proc = subprocess.Popen(pretrain_cmd(N, *args, *SLOW_WRITE), cwd=REPO, env=worker_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_step(tmp_path / "logs" / "metrics.jsonl", 3, proc)
    in_flight = not (tmp_path / "global_step2" / "complete.json").exists()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=240)
    assert in_flight, "the step-2 save finished before the signal: nothing was tested"
    assert proc.returncode == 0, stderr[-3000:]
    stopped = max(losses(tmp_path))
    assert stopped < STEPS and "stopped by signal" in stdout + stderr, stdout + stderr
    assert (tmp_path / "global_step2" / "complete.json").is_file()
    assert (tmp_path / f"global_step{stopped}" / "complete.json").is_file()
    assert (tmp_path / "latest").read_text().strip() == f"global_step{stopped}"

    out = pretrain(N, *args)
    assert f"resumed from {tmp_path / f'global_step{stopped}'}" in out.stdout + out.stderr
    ref, got = losses(uninterrupted), losses(tmp_path)
    assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]


@pytest.mark.parametrize("sig", [signal.SIGTERM], ids=["SIGTERM"])
def test_preemption_signal_saves_and_exits_cleanly(sig, uninterrupted, corpus, tmp_path):
    """SIGTERM (SIGUSR1 alike) to the job: every rank finishes the current step, a complete checkpoint is written,
    exit code 0; the next start resumes from it and continues bit for bit."""
    cmd = pretrain_cmd(N, *on_corpus(tmp_path, corpus), f"training.train_steps={STEPS}", *LAYOUT, "checkpoint.save_interval=100")
    proc = subprocess.Popen(cmd, cwd=REPO, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for_step(tmp_path / "logs" / "metrics.jsonl", 3, proc)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    stopped = max(losses(tmp_path))
    assert stopped < STEPS and "stopped by signal" in stdout + stderr, stdout + stderr
    assert (tmp_path / f"global_step{stopped}" / "complete.json").is_file()

    out = pretrain(N, *on_corpus(tmp_path, corpus), f"training.train_steps={STEPS}", *LAYOUT, "checkpoint.save_interval=100")
    assert f"resumed from {tmp_path / f'global_step{stopped}'}" in out.stdout + out.stderr
    ref, got = losses(uninterrupted), losses(tmp_path)
    assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]


def test_full_disk_during_a_save_then_resume_from_the_last_complete_one(uninterrupted, corpus, tmp_path):
    """checkpoint.dir on a real tmpfs with room for one checkpoint and a half: the save at step 4 fails with ENOSPC,
    the run stops; once space is freed (remount larger) the rerun resumes from step 2, bit for bit."""
    tag_bytes = sum(p.stat().st_size for p in (uninterrupted / f"global_step{STEPS}").rglob("*") if p.is_file())
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tag_bytes * 3 // 2 // 4096 * 4096}", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        logs = f"logging.dir={tmp_path / 'logs'}"  # the metrics stay off the small disk
        args = (f"data.manifests=[{corpus}]", f"checkpoint.dir={mnt}", logs, f"training.train_steps={STEPS}",
                *LAYOUT)
        full = pretrain(N, *args, check=False)
        out = full.stdout + full.stderr
        assert full.returncode != 0, out[-3000:]
        assert "no space left on the file system of checkpoint.dir" in out and "resumes from" in out, out[-3000:]
        assert (mnt / "latest").read_text().strip() == "global_step2"
        assert (mnt / "global_step2" / "complete.json").is_file()
        assert not (mnt / "global_step4" / "complete.json").exists()  # the partial save is not vouched for

        subprocess.run(["mount", "-o", f"remount,size={tag_bytes * 4}", "tmpfs", str(mnt)], check=True)  # free space
        resumed = pretrain(N, *args)
        out = resumed.stdout + resumed.stderr
        assert f"skipping {mnt / 'global_step4'}" in out and f"resumed from {mnt / 'global_step2'}" in out, out[-3000:]
        ref, got = losses(uninterrupted), losses(tmp_path)
        assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]
        assert (mnt / "latest").read_text().strip() == f"global_step{STEPS}"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)

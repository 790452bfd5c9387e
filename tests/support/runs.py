"""Helpers of the multi-process CPU training tests: a `python -m recipes train --local N` runner and metrics readers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import forkserver

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/runs/tiny-cpu.yaml")


def worker_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")


def on_corpus(run_dir: Path, manifest: Path) -> list[str]:
    """Overrides that train on `manifest` and checkpoint into `run_dir`."""
    return [f"data.manifests=[{manifest}]", f"checkpoint.dir={run_dir}"]


def pretrain_cmd(n: int, *overrides: str, config: str = RECIPE) -> list[str]:
    return [sys.executable, "-m", "recipes", "train", "--config", config, "--local", str(n), "--quiet", *overrides]


def recipes_cli(argv: list[str], env: dict | None = None, timeout: float = 300,
                fresh: bool = False, observe: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m recipes ARGV` in the repository, output captured: forked from the tests' pre-imported template
    (tests/support/forkserver.py), or `fresh`: a new interpreter (for what only a real start shows). `observe`: each
    rank of a training run writes what it held and the collectives it made there (tests/support/observed.py)."""
    env = worker_env() if env is None else env
    if fresh:
        return subprocess.run([sys.executable, "-m", "recipes", *argv], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=timeout)
    if observe is not None:
        return forkserver.run([str(observe), *argv], env, REPO, timeout, module="tests.support.observed")
    return forkserver.run(argv, env, REPO, timeout)


def pretrain(n: int, *overrides: str, config: str = RECIPE, timeout: int = 300,
             check: bool = True, fresh: bool = False, observe: Path | None = None) -> subprocess.CompletedProcess:
    """Run `python -m recipes train --local n` (default: the tiny recipe); output captured."""
    proc = recipes_cli(pretrain_cmd(n, *overrides, config=config)[3:], timeout=timeout, fresh=fresh,
                       observe=observe)
    if check and proc.returncode != 0:
        raise AssertionError(f"pretrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def kill_group(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGKILL a run started with start_new_session (its launcher, every rank, every writer), then wait until none
    of them is still exiting: a process killed on a loaded machine can take a moment to go, and until it has, the
    checkpoint lease rightly names it as alive (a resume started at once would be refused)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + timeout
    while _live_members(proc.pid) and time.time() < deadline:
        time.sleep(0.05)


def _live_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not yet zombies (from /proc/PID/stat: state, ppid, pgrp)."""
    live = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                live.append(int(entry))
    return live


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]


def train_records(run_dir: Path) -> list[dict]:
    return [r for r in metrics(run_dir) if "loss" in r]


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss; a resumed run's later records win (they are appended after the interrupted run's)."""
    return {r["step"]: r["loss"] for r in train_records(run_dir)}


def val_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in metrics(run_dir) if "val_loss" in r}


def wait_for_step(metrics_path: Path, step: int, proc: subprocess.Popen, timeout: float = 400) -> None:
    """Until `step` is in the run's metrics.jsonl (a test then kills the run there); fails if the run ends first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if metrics_path.is_file() and f'"step": {step},' in metrics_path.read_text():
            return
        assert proc.poll() is None, "run ended before it could be killed"
        time.sleep(0.02)
    raise AssertionError(f"step {step} never logged")

"""Helpers of the multi-process CPU training tests: a `pretrain --local` runner and metrics readers.

A uniquely named module (not conftest) so test files import it whatever other conftest.py pytest loaded first."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE = "configs/runs/tiny-cpu.yaml"


def worker_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")


def pretrain_cmd(n: int, run_dir: Path, corpus: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "recipes", "train", "--config", RECIPE, "--local", str(n), "--quiet",
            f"data.manifests=[{corpus}]", f"checkpoint.dir={run_dir}", *overrides]


def pretrain(n: int, run_dir: Path, corpus: Path, *overrides: str, timeout: int = 300,
             check: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m recipes train --local n` on the tiny recipe; output captured."""
    proc = subprocess.run(pretrain_cmd(n, run_dir, corpus, *overrides), cwd=REPO, env=worker_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"pretrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def train_records(run_dir: Path) -> list[dict]:
    path = run_dir / "logs" / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if "loss" in r]


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss; a resumed run's later records win (they are appended after the interrupted run's)."""
    return {r["step"]: r["loss"] for r in train_records(run_dir)}


def val_losses(run_dir: Path) -> dict[int, float]:
    path = run_dir / "logs" / "metrics.jsonl"
    return {r["step"]: r["val_loss"] for r in map(json.loads, path.read_text().splitlines()) if "val_loss" in r}

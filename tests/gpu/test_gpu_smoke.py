"""GPU smoke tests (skipped without CUDA): the same recipe code on CUDA + NCCL with bf16, and the throughput
benchmark. Run on a GPU machine: `.venv/bin/python -m pytest -q tests/gpu`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
REPO = Path(__file__).resolve().parents[2]


def _corpus(tmp: Path) -> Path:
    from tests.support.corpus import write_corpus

    return write_corpus(tmp / "corpus")


def _torchrun(n: int, module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "-m", module, *args]
    env = dict(os.environ, OMP_NUM_THREADS="4", PYTHONWARNINGS="ignore")
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
    return out


def test_bf16_training_on_gpu_loss_falls(tmp_path):
    n = min(2, torch.cuda.device_count())
    manifest = _corpus(tmp_path)
    _torchrun(n, "recipes", "train", "--config", "configs/runs/tiny-cpu.yaml", "--quiet",
              "cluster.device=cuda", "cluster.backend=nccl", "training.precision=bf16", "training.train_steps=30",
              f"parallel.tp={n}", f"parallel.sequence_parallel={'true' if n > 1 else 'false'}",
              f"data.manifests=[{manifest}]",
              f"checkpoint.dir={tmp_path / 'run'}", "checkpoint.save_interval=15",
              "logging.tensorboard=false")  # metrics.jsonl is enough; tensorboard is not in the GPU check's wheels
    records = [json.loads(x) for x in (tmp_path / "run" / "logs" / "metrics.jsonl").read_text().splitlines()]
    loss = [r["loss"] for r in records if "loss" in r]
    assert len(loss) == 30 and all(map(lambda v: v == v, loss))
    assert sum(loss[-5:]) / 5 < loss[0] - 0.7
    assert (tmp_path / "run" / "global_step30" / "complete.json").is_file()


def test_benchmark_reports_mfu(tmp_path):
    out_json = tmp_path / "bench.json"
    _torchrun(1, "recipes", "bench-train", "--gpu", "--config", "configs/runs/bench-gpt-1.3b-1gpu.yaml", "--steps", "6",
              "--warmup", "2", "--json", str(out_json))
    result = json.loads(out_json.read_text())
    print(result)
    assert result["tokens_per_s"] > 0 and 0 < result["mfu"] < 1

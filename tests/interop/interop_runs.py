"""Constants and helpers of the checkpoint-interop tests (a uniquely named module, not conftest, so that test files
import it whatever other conftest.py pytest loaded first)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs/runs/tiny-cpu.yaml")
VOCAB = 512
EOD = 2  # sentencepiece </s>


def stdlib_texts(max_bytes: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for p in sorted(root.glob("*.py")):
        text = p.read_text(encoding="utf-8", errors="replace")
        out.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return out


def worker_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")


def run_overrides(corpus: dict, run_dir: Path) -> list[str]:
    return [f"data.manifests=[{corpus['manifest']}]", f"model.vocab_size={VOCAB}", f"checkpoint.dir={run_dir}",
            "training.eval_interval=1000"]


def pretrain(n: int, config: str, overrides: list[str], timeout: int = 400) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "recipes", "train", "--config", config, "--local", str(n), "--quiet", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"pretrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss from metrics.jsonl (a resumed run's records come later and win)."""
    records = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


class Run:
    def __init__(self, path: Path, config: str, overrides: list[str]):
        self.path, self.config, self.overrides = path, config, overrides

    def recipe(self):
        from recipes.config.loading import load_recipe

        return load_recipe(self.config, self.overrides)

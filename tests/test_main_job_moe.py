"""The main job's MoE variant (`python -m recipes demo --moe`), end to end at a small size: experts split over EP=2
inside DP at TP=2 x PP=2 x DP=2, routing statistics in the metrics, the loss falls, the export is a transformers
Mixtral model that loads and generates."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support import rank_forks

pytestmark = pytest.mark.multiproc

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(1800)  # the whole main job (data, plan, 8 ranks, export, generate): minutes on a loaded machine
def test_demo_moe_end_to_end(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([rank_forks.python(), "-m", "recipes", "demo", "--moe", "--out", str(tmp_path),
                          "--steps", "12", "--corpus-mb", "1", "--vocab", "1000", "--quiet"],
                         cwd=REPO, env=env, text=True, capture_output=True, timeout=1500)
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"main job failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    assert "TP=2 x PP=2 x DP=2 (experts over EP=2 inside DP)" in out
    records = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5, [r["loss"] for r in train]
    tokens = 16 * 128 * 2  # global batch x seq_length x top-2 assignments per MoE layer and step
    for r in train:
        assert len(r["moe_tokens_per_expert"]) == 4 and all(sum(t) == tokens for t in r["moe_tokens_per_expert"])
        assert r["moe_dropped_tokens"] == 0 and r["moe_aux_loss"] > 0 and r["moe_z_loss"] > 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert type(model).__name__ == "MixtralForCausalLM" and model.config.num_local_experts == 8
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        ids = model.generate(tok("def read_file(path):", return_tensors="pt").input_ids, max_new_tokens=8,
                             do_sample=False)
    assert ids.shape[1] > 8
    assert (tmp_path / "report" / "report.md").is_file()

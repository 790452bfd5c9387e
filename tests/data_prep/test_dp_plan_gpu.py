"""`data_prep plan --gpu`: one hardware table with the recipes planner. The GPU's peak comes from the cluster presets
(configs/clusters/*.yaml) that `recipes plan` prices layouts with; a name no preset has is refused before any
calibration, listing the known ones (it used to be priced as an H100, the presets' own `A100-80GB` included)."""
from __future__ import annotations

import re

import pytest

from data_prep.tools.plan import CLUSTERS_DIR, gpu_peaks, peak_flops, plan
from recipes.config.loading import load_recipe
from tests.support.data_prep import run_cli

pytestmark = pytest.mark.unit

SMALL_MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4", "model.vocab_size=128",
               "model.seq_length=16", "training.global_batch=8"]


def test_the_table_is_the_planners_cluster_presets():
    """Every GPU preset, loaded by the recipes loader (extends and schema included), has the peak data_prep uses."""
    planner = {}
    for path in sorted(CLUSTERS_DIR.glob("*.yaml")):
        cluster = load_recipe(f"clusters/{path.stem}", SMALL_MODEL).cluster
        if cluster.device != "cpu":
            planner[cluster.gpu] = cluster.peak_tflops * 1e12
    assert len(planner) >= 4 and gpu_peaks() == planner
    for name, peak in planner.items():
        assert peak_flops(name) == peak_flops(name.lower()) == peak


def test_families_resolve_only_when_their_presets_agree(tmp_path):
    assert peak_flops("A100") == 312e12 and peak_flops("H100") == 989e12 and peak_flops("h200") == 989e12
    for name, peak in (("X1-40GB", 100), ("X1-80GB", 200)):  # one family, two peaks: the family name is ambiguous
        (tmp_path / f"{name}.yaml").write_text(f"cluster:\n  gpu: {name}\n  peak_tflops: {peak}\n")
    assert peak_flops("X1-80GB", tmp_path) == 200e12
    with pytest.raises(ValueError, match="--gpu X1: unknown GPU; known: X1-40GB, X1-80GB"):
        peak_flops("X1", tmp_path)


def test_compute_budget_of_an_a100_run_is_priced_at_the_a100_peak():
    cal = {"sample_bytes": 1e6, "bytes_per_token": 4.0, "bytes_per_doc": 4000.0, "mb_per_s_per_core": 1.0,
           "fast_path": True, "vocab_size": 32000}
    text = plan(1e15, cal, [1], 96, 256 << 20, model_params=130e9, gpus=800, gpu="A100-80GB", mfu=0.4, days=30)
    line = next(x for x in text.splitlines() if "compute budget" in x)
    budget = 800 * 312e12 * 0.4 * 30 * 86400 / (6 * 130e9)  # by hand: FLOP/s x s / (6 x params) = 3.32e11 tokens
    assert f"800 x A100-80GB at 40% MFU for 30 days: {budget / 1e9:.2f} G tokens" in line, line  # (not 1.05 T)
    assert f"= {budget / (1e15 / 4):.2%} of this corpus" in line


def test_unknown_gpu_is_refused_before_calibration_naming_the_known_ones():
    r = run_cli("plan", "--corpus-size", "1G", "--model-params", "1e9", "--gpus", "8", "--gpu", "V100", check=False)
    assert r.returncode == 2 and r.stdout == "", r.stdout  # nothing calibrated or printed
    assert re.fullmatch(r"error: --gpu V100: unknown GPU; known: A100-40GB, A100-80GB, H100-80GB, H200-141GB, H800-80GB "
                        r"\(from the cluster presets .*configs/clusters/\*\.yaml, the table the recipes planner uses; "
                        r"add a preset for another GPU\)\n", r.stderr), r.stderr

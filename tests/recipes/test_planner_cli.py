"""`python -m recipes plan` and `python -m recipes render`: the shipped examples' recommendations make sense,
--json/--write-recipe work, bad input exits with code 2 and a message that says what to do."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipes.planner import cli as plan
from recipes.tools import render
from recipes.config.loading import load_recipe
from recipes.planner.validation import validate

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "configs" / "examples"


def run_plan(capsys, *argv):
    rc = plan.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def plan_json(capsys, *argv):
    rc, out, err = run_plan(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_example_a_130b_needs_model_parallelism_and_answers_the_corpus_question(capsys, tmp_path):
    doc = plan_json(capsys, EXAMPLES / "a-glm-130b-100x8-a100.yaml", "--corpus-bytes", "10PB",
                    "--write-recipe", tmp_path / "a.yaml")
    lay = doc["recommended"]["layout"]
    assert lay["tp"] * lay["pp"] > 1 and lay["tp"] <= 8
    assert lay["tp"] * lay["pp"] * lay["dp"] == 800
    assert doc["recommended"]["fits"] and 0.2 < doc["recommended"]["mfu"] < 0.7
    assert all(r["layout"]["tp"] <= 8 for r in doc["ranked"])
    text = " ".join(doc["explanation"])
    assert "does not fit" in text and "of it" in text and "years" in text  # fraction of 10 PB, one-pass time
    assert doc["corpus"]["tokens"] == pytest.approx(2.5e15)
    # The written recipe is the recommended layout and passes validation including the memory check.
    written = load_recipe(tmp_path / "a.yaml")
    assert (written.parallel.tp, written.parallel.pp, written.parallel.dp) == (lay["tp"], lay["pp"], lay["dp"])
    validate(written)


def test_example_b_10b_on_tb_data_is_data_parallel(capsys):
    doc = plan_json(capsys, EXAMPLES / "b-10b-tb-data-32x8-h100.yaml", "--corpus-bytes", "2TB")
    lay = doc["recommended"]["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"]) == (1, 1, 256) and lay["zero_stage"] >= 1
    assert 9e9 < doc["parameters"] < 12e9
    assert "Plain data parallelism wins" in doc["explanation"][1]


def test_example_c_7b_on_one_node(capsys):
    rc, out, _ = run_plan(capsys, EXAMPLES / "c-llama-7b-one-node.yaml")
    assert rc == 0
    assert "<- recommended" in out and "Recommended: TP=" in out and "days" in out
    doc = plan_json(capsys, EXAMPLES / "c-llama-7b-one-node.yaml")
    rec = doc["recommended"]
    assert rec["layout"]["tp"] * rec["layout"]["pp"] * rec["layout"]["dp"] == 8
    assert rec["memory_gib"]["total"] <= 80 and rec["days"] == pytest.approx(
        2e10 / rec["tokens_per_s"] / 86400)


def test_example_d_continued_pretraining_of_llama31_on_one_node(capsys):
    doc = plan_json(capsys, EXAMPLES / "d-llama-3.1-8b-continued.yaml")
    rec = doc["recommended"]
    lay = rec["layout"]
    assert lay["tp"] * lay["cp"] * lay["pp"] * lay["dp"] == 8 and rec["fits"]
    assert doc["parameters"] == 8_030_261_248  # the released Llama-3.1-8B


def test_preset_with_cluster_and_flags(capsys):
    doc = plan_json(capsys, "models/gpt-1.3b", "--cluster", "clusters/a100-40gb", "--nodes", "2",
                    "--global-batch", "256", "--tokens", "1e10", "training.precision=bf16")
    assert doc["cluster"]["nodes"] == 2 and doc["cluster"]["gpu_memory_gb"] == 40
    assert doc["global_batch"] == 256 and doc["train_tokens"] == 1e10
    lay = doc["recommended"]["layout"]
    assert lay["tp"] * lay["pp"] * lay["dp"] == 16  # the --nodes 2 world, 8 GPUs each (the preset's)
    assert 256 % (lay["micro_batch"] * lay["dp"]) == 0  # --global-batch 256 is whole micro-batches per rank


def test_no_layout_fits_exit_2_and_says_what_would(capsys):
    rc, out, err = run_plan(capsys, "models/gpt-175b", "--cluster", "clusters/a100-40gb", "--nodes", "1")
    assert rc == 2 and out == ""
    assert "no layout fits" in err and "ZeRO-3" in err and "nodes" in err


@pytest.mark.parametrize("argv,expect", [
    (["models/gpt-17b"], "did you mean"),
    (["models/tiny"], "--global-batch"),
    (["models/tiny", "--global-batch", "8", "model.hidden_size=-3"], "model.hidden_size"),
    (["models/tiny", "--cluster", "clusters/h100-80gb", "--gpus-per-node", "16", "--global-batch", "7"],
     "no layout is valid"),
])
def test_bad_input_exit_2(capsys, argv, expect):
    rc, _, err = run_plan(capsys, *argv)
    assert rc == 2 and expect in err


def test_cli_exit_codes_in_a_real_process(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {num_layers: 2\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "recipes", "plan", str(bad), "--global-batch", "8"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"{bad}:2:" in p.stderr and "invalid YAML" in p.stderr
    p = subprocess.run([sys.executable, "-m", "recipes", "plan", "models/tiny", "--nodes", "0"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "must be positive" in p.stderr
    p = subprocess.run([sys.executable, "-m", "recipes", "render", str(EXAMPLES / "c-llama-7b-one-node.yaml"),
                        "parallel.pp=2", "parallel.zero_stage=3", "--out", str(tmp_path / "r")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "parallel.zero_stage=3 with parallel.pp=2" in p.stderr
    assert not (tmp_path / "r" / "ds_config.json").exists()


def test_render_writes_ds_config_and_resolved_recipe(tmp_path, capsys):
    overrides = ["parallel.zero_stage=2", "parallel.micro_batch=2", "parallel.recompute=full"]
    rc = render.main([str(EXAMPLES / "c-llama-7b-one-node.yaml"), *overrides, "--out", str(tmp_path), "--layout-only"])
    assert rc == 0, capsys.readouterr().err
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    assert ds["train_batch_size"] == 256 and ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_accumulation_steps"] == 256 // (2 * 8)
    assert ds["zero_optimization"]["stage"] == 2 and ds["bf16"]["enabled"] is True
    resolved = yaml.safe_load((tmp_path / "resolved.yaml").read_text())
    assert resolved["parallel"]["dp"] == 8 and resolved["model"]["ffn_hidden_size"] == 11008
    assert resolved["training"]["optimizer"]["lr"] == 1.5e-4 and resolved["cluster"]["gpu"] == "A100-80GB"
    # The resolved recipe is itself a complete recipe that reproduces the same run.
    again = load_recipe(tmp_path / "resolved.yaml").model_dump()
    original = load_recipe(EXAMPLES / "c-llama-7b-one-node.yaml", overrides + ["parallel.dp=8"]).model_dump()
    assert again == original


def test_a_recipe_with_a_layout_is_compared_with_the_recommendation(capsys):
    doc = plan_json(capsys, REPO / "configs" / "runs" / "llama-7b-1node-a100.yaml")
    own = doc["recipe_layout"]
    assert own["layout"]["zero_stage"] == 1 and own["layout"]["micro_batch"] == 1 and own["fits"]
    assert any("The recipe's own layout" in line and "ranks" in line for line in doc["explanation"])
    assert plan_json(capsys, EXAMPLES / "c-llama-7b-one-node.yaml")["recipe_layout"] is None  # sets no layout

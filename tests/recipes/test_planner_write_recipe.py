"""`recipes plan --write-recipe`: the recipe it writes launches as written (extends + only the changed keys, the
token budget, the data, the checkpoint directory, a Young/Daly save interval with its numbers printed), and what is
still missing is said, not discovered by the ranks."""
import json
import re
import math
from pathlib import Path

import pytest
import yaml

from recipes.config.loading import load_recipe
from recipes.model.shape import count_parameters
from recipes.planner import cli
from recipes.planner.save_interval import LLAMA3_FAILURES_PER_NODE_DAY, save_interval
from recipes.planner.validation import validate_for_launch
from recipes.planner.write_recipe import recipe_name

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
L70 = ["models/llama-70b", "--cluster", "clusters/h100-80gb", "--nodes", "16", "--tokens", "2e12"]


def fake_manifest(d: Path, vocab: int = 32000) -> Path:
    """A data_prep-shaped manifest whose one shard exists (empty files: the launch checks look for them, they do not
    read them)."""
    d.mkdir(parents=True, exist_ok=True)
    for ext in (".bin", ".idx"):
        (d / f"shard_000000{ext}").write_bytes(b"")
    path = d / "manifest.json"
    path.write_text(json.dumps({"tokenizer": {"vocab_size": vocab, "eod_id": 2}, "dtype": "uint16",
                                "shards": [{"prefix": "shard_000000", "tokens": 100}],
                                "blend": [100, "shard_000000"]}))
    return path


def plan(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_quickstart_plan_writes_a_recipe_that_launches(tmp_path, capsys):
    manifest = fake_manifest(tmp_path / "corpus")
    out = tmp_path / "runs" / "my-70b.yaml"
    rc, text, err = plan(capsys, *L70, "--data", manifest, "--checkpoint-dir", tmp_path / "ckpt",
                         "--write-recipe", out, "--json")
    assert rc == 0, err
    doc = json.loads(text)
    rec = doc["recommended"]
    lay = rec["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["zero_stage"], lay["micro_batch"], lay["recompute"], lay["vpp"],
            lay["schedule"]) == (2, 16, 4, 1, 1, "none", 1, "zero_bubble")
    # Young/Daly by hand: 14 bytes per parameter written at 1 GB/s per node by 16 nodes; MTBF of 16 nodes failing at
    # Llama 3's 466 / (54 x 2048) per node-day (the preset's 0.0042)
    params = doc["parameters"]
    save_s = 14 * params / (16 * 1.0e9)
    mtbf_s = 86400 / (16 * 0.0042)
    steps = max(1, round(math.sqrt(2 * save_s * mtbf_s) / rec["time_s"]["step"]))
    written = yaml.safe_load(out.read_text())
    assert written == {
        "name": "my-70b", "extends": ["models/llama-70b", "clusters/h100-80gb"],
        "training": {"train_tokens": 2_000_000_000_000}, "cluster": {"nodes": 16},
        # the recommended layout, its pipeline schedule included; zero_stage 1, micro-batch 1, recompute none and
        # vpp 1 are the schema's defaults
        "parallel": {"tp": 2, "pp": 16, "dp": 4, "sequence_parallel": True, "pipeline_schedule": "zero_bubble"},
        "data": {"manifests": [str(manifest)]},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "save_interval": steps},
    }
    recipe = load_recipe(out)
    assert validate_for_launch(recipe) == []  # nothing left to fix before a launch
    assert recipe.training.train_tokens == 2e12 and recipe.model.num_layers == 80  # the preset's model, extended
    assert doc["written_recipe"]["problems"] == []


def test_the_save_interval_numbers_are_printed(tmp_path, capsys):
    rc, text, _ = plan(capsys, *L70, "--checkpoint-dir", tmp_path / "c", "--write-recipe", tmp_path / "r.yaml")
    assert rc == 0
    line = next(x for x in text.splitlines() if "checkpoint.save_interval =" in x)
    for part in ("Young/Daly sqrt(2 x save", "x MTBF 14.9 days)", "checkpoint 966 GB (14 bytes per parameter) / 16 GB/s",
                 "MTBF = 1 / (16 nodes x 0.00420 failures per node-day)"):
        assert part in line, (part, line)
    assert (tmp_path / "r.yaml").read_text().splitlines()[1].startswith("# checkpoint.save_interval =")


def test_a_recipe_source_is_extended_by_name_and_a_file_by_relative_path(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    rc, _, err = plan(capsys, REPO / "configs/examples/c-llama-7b-one-node.yaml", "--write-recipe", out)
    assert rc == 0, err
    written = yaml.safe_load(out.read_text())
    assert written["extends"] == ["examples/c-llama-7b-one-node"]
    assert "training" not in written  # its train_tokens (2e10) is kept by extending it, not copied
    assert written["parallel"] == {"dp": 8}  # TP=PP=1, ZeRO-1, micro-batch 1: the schema's defaults
    assert set(written) == {"name", "extends", "parallel", "checkpoint"}
    own = tmp_path / "src" / "mine.yaml"
    own.parent.mkdir()
    own.write_text("extends: [models/llama-7b, clusters/a100-80gb]\ntraining: {global_batch: 256}\n")
    rc, _, err = plan(capsys, own, "--tokens", "1e9", "--write-recipe", tmp_path / "out" / "r.yaml")
    assert rc == 0, err
    assert yaml.safe_load((tmp_path / "out" / "r.yaml").read_text())["extends"] == ["../src/mine.yaml"]
    assert load_recipe(tmp_path / "out" / "r.yaml").training.train_tokens == 1_000_000_000


def test_a_corpus_budget_is_cut_to_max_days_and_says_so(tmp_path, capsys):
    rc, text, _ = plan(capsys, REPO / "configs/examples/a-glm-130b-100x8-a100.yaml", "--corpus-bytes", "10PB",
                       "--write-recipe", tmp_path / "a.yaml", "--checkpoint-dir", tmp_path / "ck", "--json")
    doc = json.loads(text)
    tokens = load_recipe(tmp_path / "a.yaml").training.train_tokens
    assert tokens == int(doc["recommended"]["tokens_per_s"] * 90 * 86400)
    assert any("what --max-days 90 allows" in n for n in doc["written_recipe"]["notes"])


def test_what_the_written_recipe_still_lacks_is_listed(tmp_path, capsys):
    rc, text, _ = plan(capsys, *L70, "--write-recipe", tmp_path / "r.yaml")
    assert rc == 0 and (tmp_path / "r.yaml").is_file()
    tail = text[text.index("before it launches"):]
    assert "data: the recipe names no training data" in tail
    days = re.search(r"2e\+12 tokens take ([\d.]+) days", text).group(1)  # the plan's own prediction
    assert f"checkpoint.dir: not set, and this run is predicted to take {days} days" in tail


def test_bad_data_or_no_budget_writes_nothing_and_exits_2(tmp_path, capsys):
    out = tmp_path / "r.yaml"
    rc, _, err = plan(capsys, *L70, "--data", tmp_path / "nowhere" / "manifest.json", "--write-recipe", out)
    assert rc == 2 and f"{tmp_path / 'nowhere' / 'manifest.json'} not found" in err and not out.exists()
    rc, _, err = plan(capsys, *L70, "--data", fake_manifest(tmp_path / "big", vocab=128256), "--write-recipe", out)
    assert rc == 2 and "model.vocab_size = 32000 is smaller than the vocabulary" in err and not out.exists()
    rc, _, err = plan(capsys, "models/llama-70b", "--cluster", "clusters/h100-80gb", "--nodes", "16",
                      "--write-recipe", out)
    assert rc == 2 and "no train length to write; pass --tokens N" in err and not out.exists()
    rc, _, err = plan(capsys, *L70, "--data", tmp_path / "m.json")
    assert rc == 2 and "add --write-recipe PATH" in err


def test_young_daly_by_hand_and_the_llama3_derivation():
    assert LLAMA3_FAILURES_PER_NODE_DAY == pytest.approx(466 / (54 * 2048))
    assert round(LLAMA3_FAILURES_PER_NODE_DAY, 4) == 0.0042  # the figure the cluster presets carry
    recipe = load_recipe("configs/runs/llama-70b-16x8-h100.yaml")
    s = save_interval(count_parameters(recipe.model), recipe.cluster, step_s=27.09)
    assert s.save_s == pytest.approx(14 * count_parameters(recipe.model) / 16e9)
    assert s.mtbf_s == pytest.approx(86400 / (16 * 0.0042))
    assert s.interval_s == pytest.approx(math.sqrt(2 * s.save_s * s.mtbf_s))
    assert s.steps == round(s.interval_s / 27.09) == recipe.checkpoint.save_interval  # the run recipe uses it
    assert s.sources == ()
    bare = recipe.cluster.model_copy(update={"node_failures_per_day": None, "checkpoint_write_gbps_per_node": None})
    noted = save_interval(count_parameters(recipe.model), bare, step_s=27.09)
    assert noted.failures_per_node_day == LLAMA3_FAILURES_PER_NODE_DAY
    assert "cluster.node_failures_per_day and cluster.checkpoint_write_gbps_per_node not set" in noted.describe()
    # four times the nodes: half the MTBF interval factor (sqrt(1/4)) against a quarter of the save time
    big = save_interval(count_parameters(recipe.model), recipe.cluster.model_copy(update={"nodes": 64}), 27.09)
    assert big.interval_s == pytest.approx(s.interval_s / 4)


def test_names_are_whole():
    assert recipe_name("models/gpt-1.3b") == "gpt-1.3b"
    assert recipe_name("configs/runs/llama-3.1-8b.yaml") == "llama-3.1-8b"
    assert recipe_name("x/r.json") == "r"


def test_an_existing_recipe_is_replaced_only_with_force(tmp_path, capsys):
    """Issue 42: `--write-recipe` onto a hand-written recipe replaced it without a word. Now it refuses in one line
    naming the file and --force, before any work, and the file is left as it was; --force replaces it atomically
    (a temporary file beside it, renamed over it: nothing else is left in the directory)."""
    out = tmp_path / "llama-7b-1node-a100.yaml"
    hand_written = "# my recipe: comments, batch, learning rate\nname: mine\nextends: [models/llama-7b]\n"
    out.write_text(hand_written)
    rc, text, err = plan(capsys, *L70, "--write-recipe", out)
    assert rc == 2 and text == ""
    assert err.strip() == (f"error: --write-recipe: {out} already exists; pass --force to replace it, or write to a "
                           "new path")
    assert out.read_text() == hand_written
    rc, _, err = plan(capsys, *L70, "--write-recipe", out, "--force")
    assert rc == 0, err
    assert out.read_text().startswith("# Written by `python -m recipes plan`")
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    assert out.stat().st_mode & 0o777 == 0o644
    rc, _, err = plan(capsys, *L70, "--force")
    assert rc == 2 and "--force go with the written recipe" in err

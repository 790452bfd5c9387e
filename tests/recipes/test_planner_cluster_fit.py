"""`recipes plan --calibrate RUN_DIR...` (issue 44, item 4): the efficiency terms fitted to a cluster's own runs, stored
as its calibration file and applied by later plans; bad run directories and files end in one line naming them.

The fit is checked by recovery: runs whose measured figures come from known terms (with a few percent of scatter, as
measurements have) must give those terms back and predict held-out layouts. The demonstration on real CPU runs of
this machine is in docs/planner.md ("Learning from your own cluster")."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from recipes.checkpoint.recipe_file import write_recipe
from recipes.config.loading import RecipeError, load_recipe
from recipes.parallel.layout import Layout
from recipes.planner import cli, cluster_fit
from recipes.planner.assumptions import Assumptions
from recipes.planner.calibration import assumptions_for, read_calibration
from recipes.planner.cost import estimate

pytestmark = pytest.mark.unit

# What the "cluster" really does: terms the fit does not know (CPU-like: slow kernels, large fixed overheads)
TRUE = dict(kernel_efficiency=3.0, elementwise_hidden=0.0, layer_overhead_s=0.002, micro_batch_overhead_s=0.006,
            step_overhead_s=0.05, intra_link_efficiency=0.03, latency_intra_s=0.001)
SHAPES = {  # run name -> (overrides, world size)
    "single": (["parallel.micro_batch=2"], 1), "single_mb4": (["parallel.micro_batch=4"], 1),
    "single_h256": (["model.hidden_size=256", "model.ffn_hidden_size=768"], 1), "dp2": ([], 2),
    "tp2": (["parallel.tp=2"], 2), "pp2": (["parallel.pp=2"], 2), "dp2_mb1": (["parallel.micro_batch=1"], 2),
    "single_l8": (["model.num_layers=8"], 1),
}
SCATTER = {"single": 1.03, "single_mb4": 0.98, "single_h256": 1.02, "dp2": 0.97, "tp2": 1.01}


def make_run(root: Path, name: str, records: int = 6) -> Path:
    """A run directory as training leaves it: recipe.yaml and logs/metrics.jsonl, its step times those of TRUE."""
    overrides, world = SHAPES[name]
    recipe = load_recipe("configs/runs/demo-cpu.yaml", ["model.vocab_size=1000", f"cluster.gpus_per_node={world}",
                                                        "parallel.tp=1", "parallel.pp=1", *overrides])
    path = root / name
    write_recipe(recipe, path)
    e = estimate(recipe.model, recipe.cluster, Layout.from_recipe(recipe), recipe.training.global_batch,
                 precision="fp32", assume=Assumptions.for_device("cpu", **TRUE))
    step = e.time_s["step"] * SCATTER.get(name, 1.0)
    compute = e.time_s["compute"] + e.time_s["recompute"] + e.time_s["overhead"]
    tokens = recipe.training.global_batch * recipe.model.seq_length
    lines = [{"step": i, "step_time_s": step * (3.0 if i == 1 else 1.0), "tokens_per_s": tokens / step,
              **({"compute_time_max_s": compute} if world > 1 else {})} for i in range(1, records + 1)]
    (path / "logs").mkdir()
    (path / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for name in SHAPES:
        make_run(root, name)
    return root


FIT = ("single", "single_mb4", "single_h256", "dp2", "tp2")
HELD = ("pp2", "dp2_mb1", "single_l8")


def test_the_fit_recovers_the_terms_and_predicts_held_out_layouts(runs):
    base, fitted, rows = cluster_fit.calibrate([str(runs / n) for n in FIT], [str(runs / n) for n in HELD])
    assert base == Assumptions.for_device("cpu")
    for row in rows:
        assert abs(row.error_before) > 0.5  # the uncalibrated CPU preset is far off
        bound = 0.05 if row.role == "fit" else 0.08  # the 3% scatter, and what it does to the terms
        assert abs(row.error) < bound, (row.run.name, row.error)
    assert fitted.latency_intra_s == pytest.approx(TRUE["latency_intra_s"], rel=0.3)
    # the fixed time of one micro-batch of the 4-layer model (its two overheads trade against each other)
    per_micro_batch = lambda a: a["micro_batch_overhead_s"] + 2 * 4 * a["layer_overhead_s"]
    assert per_micro_batch(vars(fitted)) == pytest.approx(per_micro_batch(TRUE), rel=0.15)


def test_calibrate_writes_the_cluster_s_file_and_plans_apply_it(runs, tmp_path, capsys):
    out = tmp_path / "calibration" / "cpu-local.yaml"
    argv = ["--calibrate", *(str(runs / n) for n in FIT), "--held-out", *(str(runs / n) for n in HELD),
            "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "held-out runs: largest error" in text and f"wrote {out}" in text
    cal = read_calibration(out)
    assert cal.applies_to == "cpu-local" and set(cal.terms) == set(TRUE)
    section = yaml.safe_load(out.read_text())["calibration"]
    assert [r["role"] for r in section["runs"]] == ["fit"] * len(FIT) + ["held_out"] * len(HELD)
    # found by cluster.name in the calibration directory, and applied to the plan's estimates
    recipe = load_recipe("configs/runs/demo-cpu.yaml", ["model.vocab_size=1000"])
    assume, found = assumptions_for(recipe.cluster, Assumptions.for_device("cpu"), directory=out.parent)
    assert found.path == out and assume.latency_intra_s == cal.terms["latency_intra_s"]
    # a rerun does not replace the file without --force
    assert cli.main(argv) == 2
    assert f"--calibrate: {out} already exists; pass --force to replace it" in capsys.readouterr().err
    assert cli.main([*argv, "--force"]) == 0


def test_bad_run_directories_end_in_one_line_naming_them(runs, tmp_path, capsys):
    def error(*dirs) -> str:
        assert cli.main(["--calibrate", *map(str, dirs), "--out", str(tmp_path / "c.yaml")]) == 2
        return capsys.readouterr().err.strip()

    assert error(runs / "single") == ("error: --calibrate: 1 run(s); fit on at least 2 (of different layouts, so "
                                      "compute and communication can be told apart)")
    assert error(tmp_path / "nowhere", runs / "dp2").startswith(f"error: {tmp_path / 'nowhere'}: not a directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert error(empty, runs / "dp2") == (f"error: {empty / 'recipe.yaml'}: missing; a run writes it beside its "
                                          "checkpoints (checkpoint.dir)")
    broken = make_run(tmp_path, "single")
    with open(broken / "logs" / "metrics.jsonl", "a") as f:
        f.write("{not json\n")
    assert error(broken, runs / "dp2").startswith(f"error: {broken / 'logs' / 'metrics.jsonl'}:7: not a JSON record")
    short = make_run(tmp_path / "short", "single", records=1)
    assert f"{short / 'logs' / 'metrics.jsonl'}: 1 step record(s); at least 2 are needed" in error(short, runs / "dp2")
    assert list(tmp_path.glob("c.yaml")) == []  # nothing written by a refused calibration


def test_runs_of_other_clusters_are_not_mixed(runs, tmp_path):
    other = make_run(tmp_path, "dp2")
    recipe = yaml.safe_load((other / "recipe.yaml").read_text())
    recipe["cluster"].update(name="lab-a100", gpu="A100-80GB")
    (other / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError, match="ran on cluster lab-a100 .A100-80GB., not cpu-local .cpu."):
        cluster_fit.calibrate([str(runs / "single"), str(other)])


def test_calibrate_takes_no_source_and_its_flags_need_it(capsys):
    assert cli.main(["models/llama-7b", "--calibrate", "x", "y"]) == 2
    assert "--calibrate fits terms to runs; it takes no SOURCE" in capsys.readouterr().err
    assert cli.main(["models/llama-7b", "--held-out", "x"]) == 2
    assert "--held-out and --out go with --calibrate" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert "SOURCE is required" in capsys.readouterr().err


def test_a_bad_calibration_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("calibration:\n  terms: {kernel_efficiency: 0.5, warp_speed: 9}\n")
    assert cli.main(["models/llama-7b", "--global-batch", "64", "--calibration", str(bad)]) == 2
    assert f"error: {bad}: calibration.terms has warp_speed, not efficiency terms" in capsys.readouterr().err
    bad.write_text("calibration:\n  terms: {kernel_efficiency: -1}\n")
    with pytest.raises(RecipeError, match="kernel_efficiency must be a non-negative number"):
        read_calibration(bad)
    bad.write_text("name: a recipe, not a calibration\n")
    with pytest.raises(RecipeError, match="not a calibration file"):
        read_calibration(bad)
    good = tmp_path / "good.yaml"
    good.write_text("calibration:\n  fitted_on: a test\n  terms: {kernel_efficiency: 0.25}\n")
    plan = cli.make_plan(cli.build_parser().parse_intermixed_args(
        ["models/llama-7b", "--global-batch", "64", "--calibration", str(good)]))
    assert plan.assume.kernel_efficiency == 0.25 and plan.calibration.path == good
    assert replace(plan.assume, kernel_efficiency=0.7) != plan.assume


def test_the_measured_bubble_is_read_when_the_trainer_logs_it(tmp_path):
    """pp_blocked_s (seconds blocked in pipeline sends/receives per step) is used as logged; pp_bubble (its share of
    the step) is turned into seconds; a run without either is read without them."""
    from recipes.planner.runs import read_run

    run = make_run(tmp_path, "pp2")
    metrics = run / "logs" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert read_run(run).pp_blocked_s is None
    metrics.write_text("".join(json.dumps({**r, "pp_bubble": 0.25}) + "\n" for r in records))
    assert read_run(run).pp_blocked_s == pytest.approx(0.25 * records[-1]["step_time_s"])
    metrics.write_text("".join(json.dumps({**r, "pp_bubble": 0.25, "pp_blocked_s": 0.125}) + "\n" for r in records))
    measured = read_run(run)
    assert measured.pp_blocked_s == 0.125 and ("blocked", 0.125) in cluster_fit._observations(measured)

"""The planner against published runs (issue 44): the calibration table of docs/planner.md pinned run by run, and the
four statements that must not come back (optimistic MFU, a published layout called impossible, an EP choice hanging
on an assumed imbalance stated as a result, an NVLink figure compared with one direction of a NIC)."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from recipes.config.schema import ClusterConfig
from recipes.planner import cli
from recipes.planner import explain as ex
from recipes.planner.assumptions import Assumptions
from recipes.planner.calibration import assumptions_for, find_calibration, gpu_family, read_calibration
from recipes.planner.published import PUBLISHED, price, stored_calibrations, table

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# The error each run may have, predicted / published - 1 (docs/planner.md's table): the fitted runs within 6%; the
# held-out ones within the 15% the docs state, but for the two the docs name and explain (GLM-130B's 2022 fp16 stack
# on A100-40GB, Llama 3's 128K stage priced at FlashAttention-2's share of peak), pinned at their error + 3%. A change
# to the cost model that moves an error past its bound fails here; one that improves it may tighten the bound.
FIT_BOUND = 0.06
HELD_OUT_BOUND = 0.15
EXPLAINED = {"GLM-130B, 768 A100-40GB": 0.27, "Llama 3 405B, 16,384 H100, 128K": 0.20}


@pytest.fixture(scope="module")
def rows():
    return table(stored_calibrations())


def test_the_calibration_table_is_pinned(rows):
    assert {r.run.role for r in rows} == {"fit", "held_out"}
    assert sum(r.run.role == "fit" for r in rows) == 18 and sum(r.run.role == "held_out" for r in rows) == 10
    for r in rows:
        bound = FIT_BOUND if r.run.role == "fit" else EXPLAINED.get(r.run.name, HELD_OUT_BOUND)
        assert abs(r.error) <= bound, (r.run.name, r.after, r.run.published, f"{r.error:+.1%}")
    # the H100 fit is what moved: the uncalibrated constants (the A100 fit) were 18-30% optimistic there
    h100_fit = [r for r in rows if r.run.family == "h100" and r.run.role == "fit"]
    assert min(r.error_before for r in h100_fit) > 0.15 and max(abs(r.error) for r in h100_fit) < 0.05


def test_every_run_in_the_table_cites_its_source_and_the_doc_shows_it(rows):
    from recipes.planner.published import SOURCES

    doc = (REPO / "docs" / "planner.md").read_text()
    for r in rows:
        assert r.run.source in SOURCES
        line = next(l for l in doc.splitlines() if l.startswith(f"| {r.run.name} |"))
        assert f"| {r.error:+.1%} | {r.run.source} |" in line


def test_fitted_terms_are_the_files_and_the_files_are_what_plan_applies():
    h100 = ClusterConfig(nodes=2, gpu="H100-80GB")
    assume, cal = assumptions_for(h100)
    assert cal is not None and cal.path.name == "h100.yaml"
    assert assume.kernel_efficiency == read_calibration(cal.path).terms["kernel_efficiency"]
    h200 = ClusterConfig(nodes=1, gpu="H200-141GB", gpu_memory_gb=141)
    assert gpu_family(h200) == "h100" and find_calibration(h200).name == "h100.yaml"  # the same chip
    assert find_calibration(ClusterConfig(nodes=1, gpu="cpu", name="cpu-local")) is None
    plan = cli.make_plan(cli.build_parser().parse_intermixed_args(["models/llama-7b", "--cluster",
                                                                   "clusters/a100-80gb", "--global-batch", "64"]))
    assert plan.calibration.path.name == "a100.yaml"
    assert plan.assume.gemm_falloff == stored_calibrations()["a100"].gemm_falloff


# ---------------------------------------------------------------------------------------------------------------------
# The four statements of issue 44
# ---------------------------------------------------------------------------------------------------------------------

def plan_of(*argv) -> ex.Plan:
    return cli.make_plan(cli.build_parser().parse_intermixed_args([str(a) for a in argv]))


def test_h100_mfu_is_no_longer_above_what_megatron_core_publishes():
    """Was 52% (7B, H100) and 51% (70B, H100); Megatron-Core publishes 41-48% on H100 (its weak-scaling table)."""
    for argv in (("configs/examples/d-llama-3.1-8b-continued.yaml",),
                 ("models/llama-70b", "--cluster", "clusters/h100-80gb", "--nodes", "16")):
        rec = plan_of(*argv).rec
        assert 0.38 <= rec.mfu <= 0.48, (argv, rec.mfu)


def test_a_published_layout_is_never_called_infeasible(rows):
    """Every published layout fits under its published settings; Meta's TP8 x PP16 x DP64 (no recompute) is over an
    80 GB H100 only under Korthikanti's count, an upper bound, and the plan says so where it states the verdict."""
    for r in rows:
        assert r.memory_verdict in ("fits", "tight", "maybe"), r.run.name
    plan = plan_of("models/llama-3.1-405b", "--cluster", "clusters/h100-80gb", "--nodes", "1024", "parallel.tp=8",
                   "parallel.pp=16", "parallel.sequence_parallel=true")
    own = cli.recipe_layout_estimate(plan.recipe, plan.ests, plan.assume)
    assert (own.layout.tp, own.layout.pp, own.layout.dp) == (8, 16, 64) and own.memory_verdict == "maybe"
    line = cli.own_layout_line(own, plan.ests, plan.rec, plan.assume)
    assert "does NOT fit" not in line
    assert "MAYBE, near the boundary: over the device under Korthikanti's activation count, an upper bound" in line
    assert f"within it at {own.memory_gib['total_lean']:.1f} GiB under the lean activation count" in line


def test_a_verdict_near_its_line_says_so():
    plan = plan_of("models/llama-70b", "--cluster", "clusters/h100-80gb", "--nodes", "16")
    rec = plan.rec
    near = rec.memory_gib["total"] > rec.memory_budget_gib * 0.95
    assert rec.near_boundary == near and ("near the boundary" in ex.memory(plan)) == near
    far = replace(rec, near_boundary=False)
    assert "near the boundary" not in ex.verdict_words(far, plan.assume)


MIXTRAL_32 = ("models/mixtral-8x7b", "--cluster", "clusters/h100-80gb", "--nodes", "4", "--global-batch", "256")


def test_moe_ep_is_decided_from_evidence_and_says_where_the_imbalance_comes_from(tmp_path):
    """Was: Mixtral-8x7B on 32 H100 -> EP1 (TP1 x PP16 x DP2), on an assumed imbalance of 1.2 stated as a result.
    Now: 1.0 by default with its published basis, the measured figure with --from-run, and the imbalance at which the
    choice would change."""
    plan = plan_of(*MIXTRAL_32)
    assert plan.rec.layout.ep > 1 and plan.rec.layout.ep * plan.rec.layout.tp <= 8  # inside a node
    text = ex.expert_parallel(plan)
    assert "(the default: published MoE throughput is measured with the tokens force-balanced" in text
    assert "up to an imbalance of" in text or "would win below an imbalance of" in text
    run = fake_moe_run(tmp_path / "run", imbalance=1.6)
    measured = plan_of(*MIXTRAL_32, "--from-run", run)
    assert measured.assume.moe_load_imbalance == pytest.approx(1.6)
    assert f"measured: {run / 'logs' / 'metrics.jsonl'}, median of 3 steps" in ex.expert_parallel(measured)
    # the measured imbalance prices the EP layouts: the recommendation's step is no faster than at 1.0
    assert measured.rec.tokens_per_s <= plan.rec.tokens_per_s


def fake_moe_run(path: Path, imbalance: float) -> Path:
    """A run directory as training leaves it: recipe.yaml and logs/metrics.jsonl with moe_load_imbalance."""
    from recipes.checkpoint.recipe_file import write_recipe
    from recipes.config.loading import load_recipe

    write_recipe(load_recipe("models/mixtral-8x7b", ["training.global_batch=256", "cluster.nodes=4"]), path)
    (path / "logs").mkdir()
    records = [{"step": i, "step_time_s": 5.0, "tokens_per_s": 2e5, "moe_load_imbalance": imbalance + 0.3 * (i == 1)}
               for i in range(1, 5)]
    (path / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_from_run_refuses_what_it_cannot_use(tmp_path, capsys):
    run = fake_moe_run(tmp_path / "run", 1.3)
    assert cli.main(["models/llama-7b", "--global-batch", "64", "--from-run", str(run)]) == 2
    assert "the planned model has no experts" in capsys.readouterr().err
    (run / "logs" / "metrics.jsonl").write_text('{"step": 1, "step_time_s": 1.0}\n{"step": 2, "step_time_s": 1.0}\n')
    assert cli.main([*MIXTRAL_32, "--from-run", str(run)]) == 2
    assert "no moe_load_imbalance in its step records" in capsys.readouterr().err


def test_nvlink_is_compared_with_a_nic_on_the_same_basis():
    """Was: "over InfiniBand they would run at ~50 instead of 900 GB/s per GPU": NVLink's two directions against one
    direction of a NIC, 2x overstated. Now both as the priced bus bandwidths."""
    plan = plan_of("models/llama-70b", "--cluster", "clusters/h100-80gb", "--nodes", "16")
    line = ex.tensor_parallel(plan)
    nvlink, nic = 900 * plan.assume.intra_link_efficiency, 400 * plan.assume.inter_link_efficiency / 8
    assert f"~{nic:.0f} GB/s of bus bandwidth per GPU" in line and f"instead of NVLink's ~{nvlink:.0f}" in line
    assert "counts both directions" in line and "instead of 900 GB/s per GPU" not in line


def test_every_published_run_prices():
    for run in PUBLISHED:
        assert price(run, Assumptions()) is not None, run.name

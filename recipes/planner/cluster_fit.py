"""`recipes plan --calibrate RUN_DIR...`: fit the cost model's efficiency terms to this cluster's own runs.

Each run contributes its measured step time and, where logged, its parts: the slowest rank's time outside
collectives (compute, recompute and the fixed per-step work) and the time blocked in pipeline sends and receives (the
bubble and the sends). The terms fitted are the ones the runs can tell apart: the GEMM efficiency, the element-wise
term and the fixed overheads always; the intra-node link's bandwidth and latency when a run communicates inside a node; the
inter-node link's when one spans nodes; the overlap share when a run pipelines. Runs given with --held-out are
predicted with the fitted terms, not fitted to: the error there is the calibration's error on layouts it did not see.
"""
from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from pathlib import Path

from recipes.config.loading import RecipeError
from recipes.planner.assumptions import Assumptions
from recipes.planner.calibration import CALIBRATION_DIR, fit, fitted_terms, write_calibration
from recipes.planner.cost import Estimate, estimate
from recipes.planner.runs import MeasuredRun, read_run

MIN_RUNS = 2


@dataclass(frozen=True)
class RunFit:
    run: MeasuredRun
    role: str  # "fit" or "held_out"
    before: float  # predicted tokens/s with the uncalibrated terms
    after: float  # with the fitted terms

    @property
    def error(self) -> float:
        return self.after / self.run.tokens_per_s - 1

    @property
    def error_before(self) -> float:
        return self.before / self.run.tokens_per_s - 1


def price(run: MeasuredRun, assume: Assumptions) -> Estimate:
    r = run.recipe
    return estimate(r.model, r.cluster, run.layout, r.training.global_batch, precision=r.training.precision,
                    assume=assume)


def terms_to_fit(runs: list[MeasuredRun]) -> tuple[str, ...]:
    """The terms these runs can tell apart (see the module docstring)."""
    terms = ["kernel_efficiency", "elementwise_hidden", "layer_overhead_s", "micro_batch_overhead_s",
             "step_overhead_s"]
    if any(r.layout.world_size > 1 for r in runs):
        terms += ["intra_link_efficiency", "latency_intra_s"]
    if any(r.layout.world_size > r.recipe.cluster.gpus_per_node for r in runs):
        terms += ["inter_link_efficiency", "latency_inter_s"]
    return tuple(terms)


def _observations(run: MeasuredRun) -> list[tuple[str, float]]:
    """(what, measured seconds) of a run: the step, and its measured parts when logged."""
    out = [("step", run.step_time_s)]
    if run.compute_s:
        out.append(("compute", run.compute_s))
    if run.pp_blocked_s and run.layout.pp > 1:
        out.append(("blocked", run.pp_blocked_s))
    return out


def _predicted(e: Estimate, what: str) -> float:
    t = e.terms
    if what == "compute":  # outside collectives: the FLOPs, the recompute, the fixed per-step work
        return t.compute + t.recompute + t.overhead
    if what == "blocked":  # inside pipeline sends and receives: the bubble and the sends themselves
        return t.bubble + t.pp_comm
    return t.step


def _check_same_cluster(runs: list[MeasuredRun]) -> None:
    first = runs[0].recipe.cluster
    for r in runs[1:]:
        c = r.recipe.cluster
        if (c.name, c.gpu) != (first.name, first.gpu):  # a run may use fewer GPUs of a node (gpus_per_node)
            raise RecipeError(f"{r.path}: ran on cluster {c.name} ({c.gpu}), not {first.name} ({first.gpu}) like "
                              f"{runs[0].path}; calibrate one cluster at a time")


def calibrate(fit_dirs: list[str], held_out_dirs: list[str] = ()) -> tuple[Assumptions, Assumptions, list[RunFit]]:
    """(uncalibrated, fitted assumptions, every run priced before and after)."""
    train = [read_run(d) for d in fit_dirs]
    held = [read_run(d) for d in held_out_dirs]
    if len(train) < MIN_RUNS:
        raise RecipeError(f"--calibrate: {len(train)} run(s); fit on at least {MIN_RUNS} (of different layouts, "
                          "so compute and communication can be told apart)")
    _check_same_cluster(train + held)
    base = Assumptions.for_device(train[0].recipe.cluster.device)
    obs = [(r, what, seconds) for r in train for what, seconds in _observations(r)]

    def predict(assume: Assumptions) -> list[float]:
        ests = {id(r): price(r, assume) for r in train}
        return [max(_predicted(ests[id(r)], what), 1e-9) for r, what, _ in obs]

    # A CPU preset's peak_tflops is a guess, not a datasheet figure: the achieved share may come out above 1.
    cpu = {"kernel_efficiency": (0.05, 100.0)} if train[0].recipe.cluster.device == "cpu" else None
    fitted = fit(predict, [s for _, _, s in obs], terms_to_fit(train), base, cpu)
    rows = [RunFit(run=r, role=role, before=price(r, base).tokens_per_s, after=price(r, fitted).tokens_per_s)
            for role, runs in (("fit", train), ("held_out", held)) for r in runs]
    return base, fitted, rows


def default_path(rows: list[RunFit]) -> Path:
    return CALIBRATION_DIR / f"{rows[0].run.recipe.cluster.name}.yaml"


def save(path: Path, fitted: Assumptions, rows: list[RunFit], force: bool) -> None:
    """The calibration file (recipes.planner.calibration's format); refused over an existing one without --force."""
    if path.exists() and not force:
        raise RecipeError(f"--calibrate: {path} already exists; pass --force to replace it, or --out a new path")
    cluster = rows[0].run.recipe.cluster
    terms = terms_to_fit([r.run for r in rows if r.role == "fit"])
    section = {"applies_to": cluster.name, "fitted_on": f"{sum(r.role == 'fit' for r in rows)} runs on "
               f"{cluster.name} ({datetime.date.today().isoformat()})", "terms": fitted_terms(fitted, terms),
               "runs": [{"run": str(r.run.path), "role": r.role, "layout": r.run.layout.describe(),
                         "measured_tokens_per_s": round(r.run.tokens_per_s, 3),
                         "predicted_before": round(r.before, 3), "predicted_after": round(r.after, 3),
                         "error": round(r.error, 4)} for r in rows]}
    header = ("# Written by `python -m recipes plan --calibrate`: the cost model's efficiency terms fitted to this\n"
              f"# cluster's own runs. `recipes plan` applies it to clusters named {cluster.name} when it is\n"
              f"# configs/clusters/calibration/{cluster.name}.yaml, and anywhere with --calibration FILE.\n")
    write_calibration(path, section, header)


def report(base: Assumptions, fitted: Assumptions, rows: list[RunFit]) -> str:
    """The runs, measured against predicted before and after the fit, and the fitted terms."""
    lines = ["  run          role      layout                                        measured tok/s   before    after   error"]
    for r in rows:
        lines.append(f"  {r.run.name[:12]:<12} {r.role:<9} {_shape(r.run)[:45]:<45} {r.run.tokens_per_s:>14,.0f} "
                     f"{r.before:>8,.0f} {r.after:>8,.0f} {r.error:>+7.1%}")
    held = [abs(r.error) for r in rows if r.role == "held_out"]
    terms = terms_to_fit([r.run for r in rows if r.role == "fit"])
    lines.append("fitted: " + ", ".join(f"{t} {getattr(base, t):.4g} -> {getattr(fitted, t):.4g}" for t in terms))
    if held:
        lines.append(f"held-out runs: largest error {max(held):.1%}, mean {sum(held) / len(held):.1%}")
    return "\n".join(lines)


def _shape(run: MeasuredRun) -> str:
    """'TP1 PP2 DP1 mb 2, 4 x 128': the layout and the model's layers x hidden, what tells the runs apart."""
    lay, m = run.layout, run.recipe.model
    return (f"TP{lay.tp} PP{lay.pp} DP{lay.dp}" + (f" {lay.schedule}" if lay.pp > 1 else "")
            + f", mb {lay.micro_batch} x {run.recipe.training.global_batch // lay.dp // lay.micro_batch}, "
            f"{m.num_layers} x {m.hidden_size}")


def rms_log_error(rows: list[RunFit], role: str) -> float:
    errs = [math.log(r.after / r.run.tokens_per_s) for r in rows if r.role == role]
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0

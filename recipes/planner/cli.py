"""`python -m recipes plan`: rank every parallel layout of a model on a cluster and explain the recommended one.

    python -m recipes plan configs/examples/a-glm-130b-100x8-a100.yaml --corpus-bytes 10PB --epochs 1
    python -m recipes plan models/glm-130b --cluster clusters/a100-80gb --nodes 100 --global-batch 4800
    python -m recipes plan configs/examples/c-llama-7b-one-node.yaml --json
    python -m recipes plan models/llama-70b --cluster clusters/h100-80gb --nodes 16 --tokens 2e12 \\
        --data /shared/corpus/manifest.json --checkpoint-dir /shared/ckpt/l70 --write-recipe configs/runs/l70.yaml
    python -m recipes plan --calibrate /shared/ckpt/run-a /shared/ckpt/run-b --held-out /shared/ckpt/run-c

The source is a model preset or a full recipe; dotted overrides (parallel.tp=2, training.global_batch=512) follow it.
The efficiency terms come from the cluster's calibration file (configs/clusters/calibration/: fitted to published runs
per GPU family, or to the cluster's own runs by --calibrate), named on the plan's Calibration line.
Exit code 2 for anything the user must fix (unknown preset, bad YAML, bad sizes, no layout fits, bad --data).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from data_prep.io import parse_size as parse_bytes
from recipes.config.cli_help import refuse
from recipes.config.loading import RecipeError, apply_overrides, deep_merge, load_raw, recipe_from_dict
from recipes.config.schema import Recipe
from recipes.model.shape import count_parameters, model_flops_per_step
from recipes.parallel.layout import Layout
from recipes.planner import cluster_fit, write_recipe
from recipes.planner.assumptions import Assumptions
from recipes.planner.cost import Estimate, device_memory, estimate, layout_problems
from recipes.planner.search import listed_rank, plan_layouts, what_would_fit
from recipes.planner.data_checks import data_problems
from recipes.planner.calibration import assumptions_for
from recipes.planner.explain import IMBALANCE_DEFAULT, Plan, explain, recommend, verdict_words
from recipes.planner.runs import METRICS, read_run
from recipes.planner.save_interval import save_interval
from recipes.planner.units import format_duration, human_params
from recipes.planner.validation import validate_for_launch


def parse_size(text: str) -> float:
    """'10PB', '2.5 TB', '3e12' -> bytes (decimal units, as storage is sold; data_prep's one size parser)."""
    try:
        value = parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}; write e.g. 10PB, 500TB or 3e15") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got '{text}'")
    return float(value)


def _positive(kind):
    """argparse type: a positive int or float ('1e12' is accepted for both when it is whole)."""
    def parse(text: str):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        if kind is int:
            if not value.is_integer():
                raise argparse.ArgumentTypeError(f"must be a whole number, got {text}")
            return int(value)
        return value
    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text} (0.1 = keep 10% of the memory free)")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m recipes plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", nargs="?", help="model preset (models/llama-7b) or recipe file")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.global_batch=512")
    ap.add_argument("--cluster", help="cluster preset or file merged over the source (clusters/a100-80gb)")
    ap.add_argument("--nodes", type=_positive(int))
    ap.add_argument("--gpus-per-node", type=_positive(int))
    ap.add_argument("--global-batch", type=_positive(int), help="sequences per optimizer step")
    ap.add_argument("--seq-length", type=_positive(int))
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--tokens", type=_positive(float), help="training token budget")
    budget.add_argument("--corpus-bytes", type=parse_size, help="corpus size (10PB, 2TB); with --epochs")
    ap.add_argument("--epochs", type=_positive(float), default=1.0)
    ap.add_argument("--tokens-per-byte", type=_positive(float), default=0.25,
                    help="tokenizer yield (about 0.25 tokens per byte of English text with a 32-50k BPE)")
    ap.add_argument("--max-days", type=_positive(float), default=90.0,
                    help="wall-clock a run may take, for the fraction of a corpus it can train on")
    ap.add_argument("--headroom", type=_fraction, default=Assumptions().memory_headroom,
                    help="share of each GPU's memory a recommended layout leaves free (default 0.1)")
    ap.add_argument("--top", type=_positive(int), default=12, help="rows of the ranked table")
    ap.add_argument("--calibration", metavar="FILE", help="efficiency terms fitted by --calibrate (default: the "
                    "cluster's file in configs/clusters/calibration/, by cluster.name, then GPU family)")
    ap.add_argument("--from-run", metavar="RUN_DIR", help="a MoE run's directory: its measured load imbalance "
                    "(logs/metrics.jsonl moe_load_imbalance) prices expert parallelism")
    ap.add_argument("--calibrate", nargs="+", metavar="RUN_DIR", help="fit the efficiency terms to these runs "
                    "(checkpoint.dir: recipe.yaml + logs/metrics.jsonl) and store them for their cluster; no SOURCE")
    ap.add_argument("--held-out", nargs="+", default=[], metavar="RUN_DIR", help="with --calibrate: runs predicted "
                    "with the fitted terms but not fitted to (the calibration's error on layouts it did not see)")
    ap.add_argument("--out", metavar="FILE", help="with --calibrate: where to write the calibration (default "
                    "configs/clusters/calibration/CLUSTER_NAME.yaml)")
    ap.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    ap.add_argument("--write-recipe", metavar="PATH",
                    help="write the recommended layout as a run recipe (extends the source; only the changed keys)")
    ap.add_argument("--force", action="store_true", help="with --write-recipe or --calibrate: replace an existing "
                    "file")
    ap.add_argument("--data", nargs="+", metavar="MANIFEST", help="with --write-recipe: the data_prep manifests to "
                    "train on (data.manifests)")
    ap.add_argument("--checkpoint-dir", metavar="DIR", help="with --write-recipe: checkpoint.dir (a directory every "
                    "node sees); the save interval is set from the cluster's failure rate")
    return ap


def _extra_overrides(args) -> list[str]:
    extra = list(args.overrides)
    for flag, key in (("nodes", "cluster.nodes"), ("gpus_per_node", "cluster.gpus_per_node"),
                      ("global_batch", "training.global_batch"), ("seq_length", "model.seq_length")):
        if getattr(args, flag) is not None:
            extra.append(f"{key}={getattr(args, flag)}")
    return extra


def base_raw(args) -> dict:
    """What the source (and --cluster) give before any override: what a written recipe `extends`."""
    raw = load_raw(args.source)
    return deep_merge(raw, load_raw(args.cluster)) if args.cluster else raw


def load_plan_recipe(args) -> Recipe:
    raw = apply_overrides(base_raw(args), _extra_overrides(args))
    if "training" not in raw or "global_batch" not in (raw.get("training") or {}):
        raise RecipeError(f"{args.source}: no training.global_batch; pass --global-batch N (sequences per step)")
    recipe = recipe_from_dict(raw, args.source)
    if "name" not in raw:  # unnamed: call it after its source
        recipe.name = write_recipe.recipe_name(args.source)
    return recipe


def token_budget(args, recipe: Recipe) -> tuple[float | None, dict | None]:
    """Tokens to train on and, when a corpus was given, its description."""
    if args.tokens:
        return args.tokens, None
    if args.corpus_bytes:
        corpus_tokens = args.corpus_bytes * args.tokens_per_byte
        return corpus_tokens * args.epochs, {"bytes": args.corpus_bytes, "tokens_per_byte": args.tokens_per_byte,
                                             "tokens": corpus_tokens, "epochs": args.epochs}
    t = recipe.training
    if t.train_tokens:
        return float(t.train_tokens), None
    if t.train_steps:
        return float(t.train_steps * t.global_batch * recipe.model.seq_length), None
    return None, None


def _row(i: int, e: Estimate, experts: bool = False) -> str:
    lay = e.layout
    tc = e.time_s
    fits = {"fits": "yes", "tight": "tight", "maybe": "maybe", "over": "NO"}[e.memory_verdict]
    ep = f" {lay.ep:>3}" if experts else ""
    return (f"{i:>3} {lay.tp:>3} {lay.pp:>3} {_schedule_cell(lay):>8} {lay.dp:>5} {lay.zero_stage:>4} "
            f"{lay.micro_batch:>3} "
            f"{lay.recompute:>9} {'y' if lay.sequence_parallel else 'n':>2} {lay.cp:>3}{ep} "
            f"{e.memory_gib['total']:>7.1f} "
            f"{fits:>5} {tc['step']:>8.2f} {e.tokens_per_s:>11,.0f} {e.tflops_per_gpu:>6.0f} "
            f"{e.mfu:>5.0%} {e.bubble_fraction:>6.1%} {_comm_seconds(tc):>7.2f}"
            + (f" {format_duration(e.days * 86400):>11}" if e.days is not None else ""))


def _schedule_cell(lay: Layout) -> str:
    """The pipeline schedule in a table cell: '-' without PP, '1f1b', 'int x8' (interleaved, 8 chunks per rank),
    'zb', 'zb x2'."""
    if lay.pp <= 1:
        return "-"
    name = {"1f1b": "1f1b", "interleaved_1f1b": "int", "zero_bubble": "zb"}[lay.schedule]
    return name + (f" x{lay.vpp}" if lay.vpp > 1 else "")


def _comm_seconds(terms: dict[str, float]) -> float:
    """The step's communication terms together (TP, CP, PP and DP traffic on the critical path)."""
    return sum(v for k, v in terms.items() if k.endswith("_comm"))


def format_report(plan: Plan, lines: list[str], top: int) -> str:
    recipe, ests, rec, assume = plan.recipe, plan.ests, plan.rec, plan.assume
    m, c = recipe.model, recipe.cluster
    head = [f"Plan: {recipe.name} | {human_params(count_parameters(m))} params | {c.nodes} x {c.gpus_per_node} {c.gpu} "
            f"| global batch {recipe.training.global_batch} x {m.seq_length} tokens | {len(ests)} layouts, "
            f"{sum(e.fits_with_headroom for e in ests)} fit with {assume.memory_headroom:.0%} headroom "
            f"({rec.memory_budget_gib:.1f} of {device_memory(c)}), {sum(e.tight for e in ests)} tight", "",
            ("  # ·TP ·PP schedule ···DP ZeRO ·mb recompute SP ·CP" + (" ·EP" if m.moe else "")
             + " mem·GiB ·fits ··step·s ···tokens/s TFLOP·MFU bubble comm·s").replace("·", " ")
            + ("   run time" if plan.tokens else "")]
    shown = ests[:top]
    if rec not in shown:
        shown = shown + [rec]
    for i, e in enumerate(shown, 1):
        head.append(_row(i, e, m.moe is not None) + ("  <- recommended" if e is rec else ""))
    head += ["", f"Recommended: {rec.layout.describe()}", ""] + [f"- {x}" for x in lines]
    head += ["", "Assumptions: " + ", ".join(f"{k}={v}" for k, v in asdict(assume).items()),
             "Overlap: TP collectives and pipeline sends are not overlapped (SP's backward re-gather of the "
             "column-parallel inputs overlaps their input-gradient GEMM); CP's K/V all-gathers and gradient "
             "reduce-scatters are not overlapped; ZeRO-0/1 reduce after the last backward (exposed); ZeRO-2 "
             "reduce-scatters overlap each micro-batch's backward; ZeRO-3 fetches each module's weights behind the "
             "modules before it (as far as the prefetch bucket reaches), one collective each."
             + (" MoE: the dispatch / combine all-to-alls are not overlapped; the busiest EP rank gets "
                f"{assume.moe_load_imbalance:g}x the mean routed tokens ({plan.imbalance_source})." if m.moe else ""),
             "Calibration: " + (plan.calibration.describe() if plan.calibration else
                                "none for this cluster: the constants above are the A100 fit's (docs/planner.md)")]
    return "\n".join(head)


def recipe_layout_estimate(recipe: Recipe, ests: list[Estimate], assume: Assumptions) -> Estimate | None:
    """The estimate of the layout the recipe itself sets (None when it sets none or it cannot run)."""
    if "parallel" not in recipe.model_fields_set:
        return None
    try:
        lay = Layout.from_recipe(recipe)
    except ValueError:
        return None
    for e in ests:
        if e.layout == lay:
            return e
    if layout_problems(recipe.model, recipe.cluster, lay, recipe.training.global_batch):
        return None
    return estimate(recipe.model, recipe.cluster, lay, recipe.training.global_batch,
                    precision=recipe.training.precision, assume=assume)


def own_layout_line(own: Estimate, ests: list[Estimate], rec: Estimate, assume: Assumptions) -> str:
    rank = listed_rank(own, ests)
    return (f"The recipe's own layout ({own.layout.describe()}) "
            + (f"ranks {rank} of {len(ests)}: " if rank else "is outside the search: ")
            + f"{own.memory_gib['total']:.1f} GiB per GPU ({verdict_words(own, assume)}), "
            f"{own.tokens_per_s / rec.tokens_per_s:.0%} of the recommended throughput.")


def _written_tokens(args, plan: Plan) -> tuple[int, str | None]:
    """The train length to write: the token budget; for a corpus (--corpus-bytes) at most what --max-days allows,
    with a note saying so."""
    if not plan.tokens:
        raise RecipeError("--write-recipe: no train length to write; pass --tokens N or --corpus-bytes SIZE, or set "
                          "training.train_tokens in the source recipe")
    window = plan.rec.tokens_per_s * args.max_days * 86400
    if plan.corpus is None or plan.tokens <= window:
        return int(round(plan.tokens)), None
    return int(window), (f"the corpus ({plan.tokens:.3g} tokens) takes "
                         f"{format_duration(plan.tokens / plan.rec.tokens_per_s)}; training.train_tokens = "
                         f"{window:.3g}, what --max-days {args.max_days:g} allows")


def write_planned_recipe(args, plan: Plan) -> dict:
    """Write --write-recipe; return what was written and the notes to print. Raises RecipeError (exit 2) for a bad
    --data entry, or when there is no train length."""
    recipe, rec = plan.recipe, plan.rec
    if args.data:
        bad = data_problems(recipe.model_copy(update={"data": recipe.data.model_copy(
            update={"manifests": list(args.data), "blend": [], "stages": []})}))
        if bad:
            raise RecipeError("--data: " + "\n  ".join(str(p) for p in bad))
    tokens, note = _written_tokens(args, plan)
    out = Path(args.write_recipe)
    extends = [write_recipe.extends_ref(args.source, out.parent)]
    if args.cluster:
        extends.append(write_recipe.extends_ref(args.cluster, out.parent))
    interval = save_interval(count_parameters(recipe.model), recipe.cluster, rec.time_s["step"])
    base = base_raw(args)
    target = apply_overrides(base, _extra_overrides(args))
    target["name"] = write_recipe.recipe_name(str(out))
    target.setdefault("parallel", {}).update(write_recipe.layout_keys(rec))
    training = target.setdefault("training", {})
    training.update(train_tokens=tokens, **({"train_steps": None} if training.get("train_steps") else {}))
    if args.data:
        target.setdefault("data", {})["manifests"] = list(args.data)
    ckpt = target.setdefault("checkpoint", {})
    if args.checkpoint_dir:
        ckpt["dir"] = args.checkpoint_dir
    ckpt["save_interval"] = interval.steps
    header = (f"# Written by `python -m recipes plan` ({rec.layout.describe()}; {rec.tokens_per_s:,.0f} tokens/s "
              f"predicted).\n# {interval.describe()}\n")
    body = write_recipe.write(out, extends, write_recipe.with_defaults(base), target, header)
    problems = validate_for_launch(write_recipe.load_recipe(out))
    return {"path": str(out), "recipe": body, "save_interval": asdict(interval), "notes": [n for n in [note] if n],
            "save_interval_text": interval.describe(), "problems": [str(p) for p in problems]}


def _no_layout(recipe: Recipe, ests: list[Estimate], assume: Assumptions) -> RecipeError:
    return RecipeError(f"no layout {'fits' if ests else 'is valid for'} {recipe.model.num_layers} layers x "
                       f"{recipe.model.hidden_size} hidden on {recipe.cluster.world_size} x {recipe.cluster.gpu}: "
                       + what_would_fit(recipe.model, recipe.cluster, recipe.training.global_batch,
                                        precision=recipe.training.precision, assume=assume))


def make_plan(args) -> Plan:
    recipe = load_plan_recipe(args)
    assume, calibration = assumptions_for(recipe.cluster, Assumptions(memory_headroom=args.headroom),
                                          args.calibration)
    imbalance = IMBALANCE_DEFAULT
    if args.from_run:
        assume, imbalance = measured_imbalance(args.from_run, recipe, assume)
    tokens, corpus = token_budget(args, recipe)
    ests = plan_layouts(recipe.model, recipe.cluster, recipe.training.global_batch,
                        precision=recipe.training.precision, train_tokens=tokens, assume=assume)
    rec = recommend(ests)
    if rec is None:
        raise _no_layout(recipe, ests, assume)
    return Plan(recipe, ests, rec, tokens, corpus, args.max_days, assume, calibration, imbalance)


def measured_imbalance(run_dir: str, recipe: Recipe, assume: Assumptions) -> tuple[Assumptions, str]:
    """The run's measured moe_load_imbalance (median over its steps) in place of the default, and the words that
    say where it comes from."""
    if recipe.model.moe is None:
        raise RecipeError(f"--from-run {run_dir}: the planned model has no experts (no model.moe); --from-run "
                          "reads a MoE run's load imbalance")
    run = read_run(run_dir)
    if run.moe_load_imbalance is None:
        raise RecipeError(f"{run.path / METRICS}: no moe_load_imbalance in its step records; --from-run needs a MoE "
                          "run's metrics (a dense run logs none)")
    words = (f"measured: {run.path / METRICS}, median of {run.records} steps; the busiest expert over the mean, an "
             "upper bound for an EP rank")
    return replace(assume, moe_load_imbalance=max(1.0, run.moe_load_imbalance)), words


def calibrate_main(args) -> int:
    """`plan --calibrate RUN_DIR... [--held-out RUN_DIR...] [--out FILE] [--force]`."""
    try:
        base, fitted, rows = cluster_fit.calibrate(args.calibrate, args.held_out)
        out = Path(args.out) if args.out else cluster_fit.default_path(rows)
        cluster_fit.save(out, fitted, rows, args.force)
    except RecipeError as e:
        return refuse(e)
    print(f"Calibrated {len([r for r in rows if r.role == 'fit'])} runs on {rows[0].run.recipe.cluster.name}:")
    print(cluster_fit.report(base, fitted, rows))
    print(f"wrote {out}: `recipes plan` applies it to clusters named {rows[0].run.recipe.cluster.name}"
          + ("" if not args.out else f" when given --calibration {out}"))
    return 0


def _argument_error(args) -> str | None:
    """Flags that go together, checked before any work."""
    if args.calibrate:
        if args.source or args.write_recipe:
            return "--calibrate fits terms to runs; it takes no SOURCE and writes no recipe (plan with them after)"
        return None
    if args.held_out or args.out:
        return "--held-out and --out go with --calibrate RUN_DIR..."
    if not args.source:
        return "SOURCE is required: a model preset (models/llama-7b) or a recipe file, or --calibrate RUN_DIR..."
    if (args.data or args.checkpoint_dir or args.force) and not args.write_recipe:
        return "--data, --checkpoint-dir and --force go with the written recipe; add --write-recipe PATH"
    return None


def main(argv=None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    problem = _argument_error(args)
    if problem:
        return refuse(problem)
    if args.calibrate:
        return calibrate_main(args)
    try:
        if args.write_recipe:  # before any work: a finished recipe is replaced only when asked
            write_recipe.refuse_existing(Path(args.write_recipe), args.force)
        plan = make_plan(args)
        lines = explain(plan)
        own = recipe_layout_estimate(plan.recipe, plan.ests, plan.assume)
        if own is not None:
            lines.append(own_layout_line(own, plan.ests, plan.rec, plan.assume))
        written = write_planned_recipe(args, plan) if args.write_recipe else None
    except RecipeError as e:
        return refuse(e)
    if args.json:
        print(json.dumps(plan_document(plan, lines, own, written, args.top), indent=1))
        return 0
    print(format_report(plan, lines, args.top))
    if written:
        print(f"\nwrote {written['path']} (extends {', '.join(written['recipe']['extends'])})")
        for line in [written["save_interval_text"]] + written["notes"]:
            print(f"  {line}")
        if written["problems"]:
            print("before it launches (`recipes train`, `render` and the launcher refuse it until then):")
            for problem in written["problems"]:
                print(f"  - {problem}")
    return 0


def plan_document(plan: Plan, lines: list[str], own: Estimate | None, written: dict | None, top: int) -> dict:
    recipe, ests, rec = plan.recipe, plan.ests, plan.rec
    return {
        "recipe": recipe.name, "parameters": count_parameters(recipe.model),
        "model_flops_per_step": model_flops_per_step(recipe.model, recipe.training.global_batch),
        "cluster": recipe.cluster.model_dump(mode="json"), "global_batch": recipe.training.global_batch,
        "seq_length": recipe.model.seq_length, "train_tokens": plan.tokens, "corpus": plan.corpus,
        "layouts_searched": len(ests), "layouts_fitting": sum(e.fits_with_headroom for e in ests),
        "layouts_tight": sum(e.tight for e in ests),
        "recommended": rec.to_dict(), "explanation": lines, "assumptions": asdict(plan.assume),
        "calibration": (plan.calibration.describe() if plan.calibration else None),
        "ranked": [e.to_dict() for e in ests[:top]],
        "recipe_layout": own.to_dict() if own is not None else None,
        "written_recipe": written,
    }


if __name__ == "__main__":
    sys.exit(main())

"""`python -m recipes plan`: rank every parallel layout of a model on a cluster and explain the recommended one.

    python -m recipes plan configs/examples/a-glm-130b-100x8-a100.yaml --corpus-bytes 10PB --epochs 1
    python -m recipes plan models/glm-130b --cluster clusters/a100-80gb --nodes 100 --global-batch 4800
    python -m recipes plan configs/examples/c-llama-7b-one-node.yaml --json
    python -m recipes plan models/llama-7b --cluster clusters/h100-80gb --write-recipe /tmp/run.yaml

The source is a model preset or a full recipe; dotted overrides (parallel.tp=2, training.global_batch=512) follow it.
Exit code 2 for anything the user must fix (unknown preset, bad YAML, bad sizes, no layout fits).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import yaml

from data_prep.io import parse_size as parse_bytes
from recipes.config.schema import Recipe
from recipes.parallel.layout import Layout
from recipes.config.loading import RecipeError, apply_overrides, deep_merge, load_raw, recipe_from_dict
from recipes.model.shape import count_parameters, model_flops_per_step
from recipes.planner.cost import (
    Assumptions, Estimate, estimate, format_memory, layout_problems, listed_rank, plan_layouts, what_would_fit,
)

CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal tokens per parameter
NEAR_BEST = 0.02  # layouts within 2% of the fastest are "as fast"; among them the simplest is recommended
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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m recipes plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="model preset (models/llama-7b) or recipe file")
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
    ap.add_argument("--top", type=_positive(int), default=12, help="rows of the ranked table")
    ap.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    ap.add_argument("--write-recipe", metavar="PATH", help="write the recommended layout as a full recipe")
    return ap


def load_plan_recipe(args) -> Recipe:
    raw = load_raw(args.source)
    if args.cluster:
        raw = deep_merge(raw, load_raw(args.cluster))
    extra = list(args.overrides)
    for flag, key in (("nodes", "cluster.nodes"), ("gpus_per_node", "cluster.gpus_per_node"),
                      ("global_batch", "training.global_batch"), ("seq_length", "model.seq_length")):
        if getattr(args, flag) is not None:
            extra.append(f"{key}={getattr(args, flag)}")
    raw = apply_overrides(raw, extra)
    if "training" not in raw or "global_batch" not in (raw.get("training") or {}):
        raise RecipeError(f"{args.source}: no training.global_batch; pass --global-batch N (sequences per step)")
    recipe = recipe_from_dict(raw, args.source)
    if recipe.name == "recipe":  # unnamed: call it after its source
        recipe.name = Path(args.source).stem
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


def _complexity(e: Estimate):
    lay = e.layout
    # No model parallelism first; then avoid ZeRO-3 (its per-micro-batch weight gathers are the least certain
    # overlap in the model); then the least model parallelism, the lowest stage and the least recompute.
    return (lay.model_parallel_size > 1, lay.zero_stage == 3, lay.model_parallel_size, lay.pp, lay.zero_stage,
            ("none", "selective", "full").index(lay.recompute), -e.tokens_per_s)


def recommend(ests: list[Estimate]) -> Estimate | None:
    """The simplest layout (see `_complexity`) among those within 2% of the fastest that fit."""
    fitting = [e for e in ests if e.fits]
    if not fitting:
        return None
    best = fitting[0].tokens_per_s
    near = [e for e in fitting if e.tokens_per_s >= best * (1 - NEAR_BEST)]
    return min(near, key=_complexity)


def _best(ests, pred):
    return next((e for e in ests if e.fits and pred(e.layout)), None)


def explain(recipe: Recipe, ests: list[Estimate], rec: Estimate, tokens: float | None, corpus: dict | None,
            max_days: float) -> list[str]:
    """Plain-language reasons for the recommendation, each backed by a number from the plan."""
    m, c = recipe.model, recipe.cluster
    params = count_parameters(m)
    lay = rec.layout
    out = []
    states_gib = 16 * params / 2**30
    out.append(f"The model has {human_params(params)} parameters; Adam with mixed precision (or fp32) needs 16 bytes "
               f"each = {states_gib:,.1f} GiB of model states, against {c.gpu_memory_gb:g} GiB per {c.gpu}.")
    pure_dp = _best(ests, lambda l: l.tp == 1 and l.pp == 1 and l.zero_stage < 3)
    zero3_dp = _best(ests, lambda l: l.tp == 1 and l.pp == 1 and l.zero_stage == 3)
    if lay.model_parallel_size == 1:
        shards = {0: "nothing (every GPU keeps all 16 bytes per parameter)", 1: "the optimizer states",
                  2: "the optimizer states and gradients", 3: "parameters, gradients and optimizer states"}
        why = (f"Plain data parallelism wins: no layer is split, so there is no tensor-parallel all-reduce and no "
               f"pipeline bubble; ZeRO-{lay.zero_stage} shards {shards[lay.zero_stage]} over {lay.dp} ranks, "
               f"which is enough to fit.")
        lower = _best(ests, lambda l: l.model_parallel_size == 1 and l.zero_stage < lay.zero_stage)
        if lower is not None:
            why += (f" The best lower ZeRO stage ({lower.layout.describe()}) reaches "
                    f"{lower.tokens_per_s / rec.tokens_per_s:.0%} of its throughput.")
        elif lay.zero_stage > 0:
            why += f" Lower ZeRO stages do not fit in {c.gpu_memory_gb:g} GiB."
        out.append(why)
    else:
        if pure_dp is None and zero3_dp is None:
            out.append(f"Model parallelism is forced by memory: with TP=PP=1 even ZeRO-3 and full recompute at "
                       f"micro-batch 1 exceed {c.gpu_memory_gb:g} GiB (ZeRO-1/2 keep a full 2-byte copy of the "
                       f"weights, {2 * params / 2**30:,.0f} GiB, on every GPU).")
        elif pure_dp is None:
            out.append(f"Without ZeRO-3, TP=PP=1 does not fit (ZeRO-1/2 keep a full 2-byte copy of the weights, "
                       f"{2 * params / 2**30:,.0f} GiB, on every GPU); ZeRO-3 over all {c.world_size} GPUs fits but "
                       f"runs at {zero3_dp.tokens_per_s / rec.tokens_per_s:.0%} of the recommended layout's "
                       f"throughput because it all-gathers the weights every micro-batch "
                       f"({zero3_dp.time_s['dp_comm']:.1f} s exposed per step).")
        else:
            out.append(f"The best pure data-parallel layout ({pure_dp.layout.describe()}) fits but reaches "
                       f"{pure_dp.tokens_per_s / rec.tokens_per_s:.0%} of this layout's throughput.")
        if lay.tp > 1:
            out.append(f"TP={lay.tp} stays inside a node (at most {c.gpus_per_node} GPUs on NVLink): its 4 "
                       f"all-reduces per layer per micro-batch cost {rec.time_s['tp_comm']:.2f} s per step "
                       f"({rec.time_s['tp_comm'] / rec.time_s['step']:.0%}); over InfiniBand they would run at "
                       f"~{c.inter_node_gbps / c.gpus_per_node:.0f} instead of {c.intra_node_gbps:.0f} GB/s per GPU.")
        if lay.pp > 1:
            out.append(f"PP={lay.pp} splits the layers into stages; with {rec.micro_batches} micro-batches per step "
                       f"the 1F1B bubble (p-1)/m = {rec.bubble_fraction:.1%} costs {rec.time_s['bubble']:.2f} s, "
                       f"and stage-to-stage sends {rec.time_s['pp_comm']:.2f} s.")
    if lay.dp > 1:
        out.append(f"DP={lay.dp}: gradient/parameter traffic of ZeRO-{lay.zero_stage} leaves "
                   f"{rec.time_s['dp_comm']:.2f} s of communication exposed per step.")
    out.append(f"Memory per GPU: {format_memory(rec.memory_gib)} of {c.gpu_memory_gb:g} GiB"
               + (f" (recompute={lay.recompute} keeps the activations in budget)." if lay.recompute != "none" else "."))
    out.append(f"Predicted step {rec.time_s['step']:.2f} s, {rec.tokens_per_s:,.0f} tokens/s, "
               f"{rec.tflops_per_gpu:.0f} model TFLOP/s per GPU = {rec.mfu:.0%} MFU.")
    if tokens:
        span = f"{rec.days:,.1f} days" if rec.days <= 730 else f"{rec.days / 365:,.0f} years"
        out.append(f"{tokens:.3g} tokens take {span} on {c.world_size} GPUs ({_count(rec.gpu_hours)} GPU-hours).")
    tokens_in_window = rec.tokens_per_s * max_days * 86400
    if corpus:
        frac = tokens_in_window / corpus["tokens"]
        epoch_days = corpus["tokens"] / rec.tokens_per_s / 86400
        epoch = f"{epoch_days / 365:,.0f} years" if epoch_days > 730 else f"{epoch_days:,.1f} days"
        if frac < 1:
            out.append(f"The corpus is {corpus['bytes']:.3g} bytes ~ {corpus['tokens']:.3g} tokens; in {max_days:g} "
                       f"days one run trains on {tokens_in_window:.3g} tokens = {frac:.3%} of it (one pass over all "
                       f"of it would take {epoch}).")
        else:
            out.append(f"The corpus is {corpus['bytes']:.3g} bytes ~ {corpus['tokens']:.3g} tokens; one pass takes "
                       f"{epoch}, so {max_days:g} days would allow {frac:,.0f} passes: the data, not the "
                       f"cluster, bounds this run.")
    optimal = CHINCHILLA_TOKENS_PER_PARAM * params
    out.append(f"Compute-optimal data for this size is ~{optimal:.3g} tokens (20 per parameter, Hoffmann et al. "
               f"2022): {optimal / rec.tokens_per_s / 86400:,.1f} days at this rate.")
    return out


def human_params(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _count(x: float) -> str:
    return f"{x:,.0f}" if x < 1e9 else f"{x:.3g}"


def _row(i: int, e: Estimate) -> str:
    lay = e.layout
    tc = e.time_s
    return (f"{i:>3} {lay.tp:>3} {lay.pp:>3} {lay.dp:>5} {lay.zero_stage:>4} {lay.micro_batch:>3} "
            f"{lay.recompute:>9} {'y' if lay.sequence_parallel else 'n':>2} {e.memory_gib['total']:>7.1f} "
            f"{'yes' if e.fits else 'NO':>4} {tc['step']:>8.2f} {e.tokens_per_s:>11,.0f} {e.tflops_per_gpu:>6.0f} "
            f"{e.mfu:>5.0%} {e.bubble_fraction:>6.1%} {tc['tp_comm'] + tc['pp_comm'] + tc['dp_comm']:>7.2f}"
            + (f" {e.days:>9,.1f}" if e.days is not None else ""))


def format_report(recipe: Recipe, ests: list[Estimate], rec: Estimate, lines: list[str], top: int,
                  tokens: float | None, assume: Assumptions) -> str:
    m, c = recipe.model, recipe.cluster
    fitting = sum(e.fits for e in ests)
    head = [f"Plan: {recipe.name} | {human_params(count_parameters(m))} params | {c.nodes} x {c.gpus_per_node} {c.gpu} "
            f"| global batch {recipe.training.global_batch} x {m.seq_length} tokens | {len(ests)} layouts, "
            f"{fitting} fit", "",
            "  # ·TP ·PP ···DP ZeRO ·mb recompute SP mem·GiB fits ··step·s ···tokens/s TFLOP·MFU bubble comm·s"
            .replace("·", " ") + ("  days" if tokens else "")]
    shown = ests[:top]
    if rec not in shown:
        shown = shown + [rec]
    for i, e in enumerate(shown, 1):
        head.append(_row(i, e) + ("  <- recommended" if e is rec else ""))
    head += ["", f"Recommended: {rec.layout.describe()}", ""] + [f"- {x}" for x in lines]
    head += ["", "Assumptions: " + ", ".join(f"{k}={v}" for k, v in asdict(assume).items()),
             "Overlap: TP collectives and pipeline sends are not overlapped; ZeRO-0/1 reduce after the last backward "
             "(exposed); ZeRO-2 reduce-scatters overlap each micro-batch's backward; ZeRO-3 gathers overlap compute."]
    return "\n".join(head)


def recipe_layout_estimate(recipe: Recipe, ests: list[Estimate]) -> Estimate | None:
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
                    precision=recipe.training.precision)


def recipe_for_layout(recipe: Recipe, rec: Estimate) -> dict:
    lay = rec.layout
    data = recipe.model_dump(mode="json")
    data["parallel"].update(tp=lay.tp, pp=lay.pp, dp=lay.dp, zero_stage=lay.zero_stage, micro_batch=lay.micro_batch,
                            sequence_parallel=lay.sequence_parallel, recompute=lay.recompute)
    return data


def main(argv=None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    assume = Assumptions()
    try:
        recipe = load_plan_recipe(args)
        tokens, corpus = token_budget(args, recipe)
        ests = plan_layouts(recipe.model, recipe.cluster, recipe.training.global_batch,
                            precision=recipe.training.precision, train_tokens=tokens, assume=assume)
        rec = recommend(ests)
        if rec is None:
            raise RecipeError(f"no layout {'fits' if ests else 'is valid for'} {recipe.model.num_layers} layers x "
                              f"{recipe.model.hidden_size} hidden "
                              f"on {recipe.cluster.world_size} x {recipe.cluster.gpu}: "
                              + what_would_fit(recipe.model, recipe.cluster, recipe.training.global_batch,
                                               precision=recipe.training.precision, assume=assume))
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lines = explain(recipe, ests, rec, tokens, corpus, args.max_days)
    own = recipe_layout_estimate(recipe, ests)
    if own is not None:
        rank = listed_rank(own, ests)
        lines.append(f"The recipe's own layout ({own.layout.describe()}) "
                     + (f"ranks {rank} of {len(ests)}: " if rank else "is outside the search: ")
                     + f"{own.memory_gib['total']:.1f} GiB per GPU ({'fits' if own.fits else 'does NOT fit'}), "
                     f"{own.tokens_per_s / rec.tokens_per_s:.0%} of the recommended throughput.")
    if args.write_recipe:
        out = Path(args.write_recipe)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# Written by python -m recipes plan: {rec.layout.describe()}\n"
                       + yaml.safe_dump(recipe_for_layout(recipe, rec), sort_keys=False))
    if args.json:
        doc = {
            "recipe": recipe.name, "parameters": count_parameters(recipe.model),
            "model_flops_per_step": model_flops_per_step(recipe.model, recipe.training.global_batch),
            "cluster": recipe.cluster.model_dump(mode="json"), "global_batch": recipe.training.global_batch,
            "seq_length": recipe.model.seq_length, "train_tokens": tokens, "corpus": corpus,
            "layouts_searched": len(ests), "layouts_fitting": sum(e.fits for e in ests),
            "recommended": rec.to_dict(), "explanation": lines, "assumptions": asdict(assume),
            "ranked": [e.to_dict() for e in ests[:args.top]],
            "recipe_layout": own.to_dict() if own is not None else None,
        }
        print(json.dumps(doc, indent=1))
    else:
        print(format_report(recipe, ests, rec, lines, args.top, tokens, assume))
        if args.write_recipe:
            print(f"\nwrote {args.write_recipe}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

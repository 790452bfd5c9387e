"""Run report: a Markdown page with the recipe, the plan, measured throughput/MFU and PNG plots.

Inputs are files the other stages already write (the training run's metrics.jsonl, the planner's --json output), so
a report can be rebuilt for any finished run: `python -m recipes.tools.report --metrics LOGDIR/metrics.jsonl --plan plan.json
--out DIR`.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from recipes.config.cli_help import command_parser


def _pyplot():
    """matplotlib's pyplot, headless (the report is files, never a window). Imported when a plot is drawn (~0.6 s of
    CPU): reading metrics and summarizing them need none of it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "fragmentation")


def read_metrics(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(train records, validation records) from a metrics.jsonl; a resumed run's repeated steps keep the last."""
    train: dict[int, dict] = {}
    valid: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if "val_loss" in rec:
            valid[rec["step"]] = rec
        elif "loss" in rec:
            train[rec["step"]] = rec
    return [train[k] for k in sorted(train)], [valid[k] for k in sorted(valid)]


def read_evals(path: str | Path) -> list[dict]:
    """The downstream-evaluation records of a metrics.jsonl (`recipes evaluate --log-metrics`: step + eval/<task>/<metric>
    scores), one per step, the last written winning."""
    evals: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if any(k.startswith("eval/") for k in rec):
                evals[rec["step"]] = {**evals.get(rec["step"], {}), **rec}
    return [evals[k] for k in sorted(evals)]


def stage_starts(train: list[dict]) -> list[tuple[int, str]]:
    """(first step, name) of every data stage after the first, from the `stage` field of the training records."""
    starts, previous = [], None
    for r in train:
        name = r.get("stage")
        if name is not None and previous is not None and name != previous:
            starts.append((r["step"], name))
        previous = name if name is not None else previous
    return starts


def plot_losses(train: list[dict], valid: list[dict], out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss", lw=1.2)
    if valid:
        ax.plot([r["step"] for r in valid], [r["val_loss"] for r in valid], "o-", label="validation loss")
    for step, name in stage_starts(train):  # a boundary sits between the last step of a stage and this one
        ax.axvline(step - 0.5, color="grey", ls=":", lw=1)
        ax.annotate(f"stage {name}", (step - 0.5, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize=7, color="grey")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_throughput(train: list[dict], out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["tokens_per_s"] for r in train], lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s (whole job)")
    ax.set_title("Training throughput")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_evals(evals: list[dict], out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = sorted({k for r in evals for k in r if k.startswith("eval/")})
    for k in keys:
        pts = [(r["step"], r[k]) for r in evals if isinstance(r.get(k), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=k[len("eval/"):])
    ax.set_xlabel("step")
    ax.set_ylabel("score")
    ax.set_yscale("log" if any("perplexity" in k for k in keys) else "linear")
    ax.set_title("Downstream evaluation (lm-evaluation-harness)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_memory(plan: dict, out: Path, top: int = 10) -> Path:
    """Stacked bars of the planner's predicted memory per GPU for the best `top` layouts (+ the GPU's capacity)."""
    rows = plan["ranked"][:top]
    labels = [_short(r["layout"]) for r in rows]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(rows) + 2), 4.5))
    bottom = [0.0] * len(rows)
    for part in MEMORY_PARTS:
        vals = [r["memory_gib"].get(part, 0.0) for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(plan["recommended"]["gpu_memory_gib"], color="k", ls="--", lw=1, label="GPU memory")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(f"Predicted memory per GPU: {plan['recipe']} on {plan['cluster']['nodes']} x "
                 f"{plan['cluster']['gpus_per_node']} {plan['cluster']['gpu']}")
    ax.tick_params(axis="x", rotation=60, labelsize=7)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _score(v) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else "-"


def _short(layout: dict) -> str:
    s = f"t{layout['tp']}p{layout['pp']}d{layout['dp']} z{layout['zero_stage']} mb{layout['micro_batch']}"
    if layout.get("recompute", "none") != "none":
        s += f" rc={layout['recompute'][:3]}"
    return s


def summarize_training(train: list[dict], skip_first: int = 2) -> dict:
    """Median throughput over steady-state steps (the first steps include warm-up and are left out)."""
    steady = train[skip_first:] or train
    return {
        "steps": len(train),
        "first_loss": train[0]["loss"] if train else None,
        "last_loss": train[-1]["loss"] if train else None,
        "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady) if steady else None,
        "median_tflops_per_gpu": statistics.median(r["tflops_per_gpu"] for r in steady) if steady else None,
        "median_mfu": statistics.median(r["mfu"] for r in steady) if steady else None,
        "median_step_time_s": statistics.median(r["step_time_s"] for r in steady) if steady else None,
        "skipped_steps": train[-1].get("nan_skips_total", 0) if train else 0,
    }


def moe_lines(train: list[dict]) -> list[str]:
    """The routing section of a mixture-of-experts run (recipes.model.moe.routing_stats in metrics.jsonl)."""
    moe = [r for r in train if "moe_tokens_per_expert" in r]
    if not moe:
        return []
    first, last = moe[0], moe[-1]
    lines = ["## Experts (routing)", "",
             f"- load imbalance (busiest expert / mean, worst MoE layer): {first['moe_load_imbalance']:.2f} at step "
             f"{first['step']} -> {last['moe_load_imbalance']:.2f} at step {last['step']}",
             f"- dropped token-expert assignments: {sum(r['moe_dropped_tokens'] for r in moe):,} "
             f"({max(r['moe_dropped_frac'] for r in moe):.1%} at most in a step; 0 = dropless)"]
    for key, name in (("moe_aux_loss", "load-balancing loss"), ("moe_z_loss", "router z-loss")):
        if key in last:
            lines.append(f"- {name} (without its coefficient): {first[key]:.4f} -> {last[key]:.4f}")
    lines.append(f"- tokens per expert at step {last['step']}, per MoE layer: "
                 + "; ".join(" ".join(str(t) for t in layer) for layer in last["moe_tokens_per_expert"]))
    return lines + [""]


def write_report(out_dir: str | Path, *, metrics: str | Path, plans: dict[str, dict] | None = None,
                 recipe_text: str = "", extra_sections: list[tuple[str, str]] = ()) -> Path:
    """Write report.md + PNGs into out_dir; returns the report path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, valid = read_metrics(metrics)
    s = summarize_training(train)
    plot_losses(train, valid, out / "loss.png")
    plot_throughput(train, out / "throughput.png")
    lines = ["# Run report", ""]
    if recipe_text:
        lines += ["## Recipe", "", "```yaml", recipe_text.rstrip(), "```", ""]
    lines += [
        "## Training", "",
        f"- steps: {s['steps']}, loss {s['first_loss']:.4f} -> {s['last_loss']:.4f}",
        "- validation: " + (", ".join(f"step {r['step']}: {r['val_loss']:.4f} (ppl {r['val_ppl']:.1f})"
                                       for r in valid) or "none"),
        f"- median step time {s['median_step_time_s']:.3f} s, {s['median_tokens_per_s']:,.0f} tokens/s, "
        f"{s['median_tflops_per_gpu'] * 1e3:.2f} GFLOP/s per rank, MFU {s['median_mfu']:.1%} of the recipe's "
        f"cluster.peak_tflops",
        f"- skipped (non-finite) steps: {s['skipped_steps']}",
        "", "![loss](loss.png)", "", "![throughput](throughput.png)", "",
    ]
    starts = stage_starts(train)
    if starts:
        first = train[0].get("stage")
        lines[-5:-5] = [f"- data stages: {first} from step {train[0]['step']}, "
                        + ", ".join(f"{name} from step {step}" for step, name in starts)]
    lines += moe_lines(train)
    evals = read_evals(metrics)
    if evals:
        plot_evals(evals, out / "evals.png")
        keys = sorted({k for r in evals for k in r if k.startswith("eval/")})
        lines += ["## Downstream evaluation", "", "| step | " + " | ".join(k[len("eval/"):] for k in keys) + " |",
                  "|---" * (len(keys) + 1) + "|"]
        lines += [f"| {r['step']} | " + " | ".join(_score(r.get(k)) for k in keys) + " |" for r in evals]
        lines += ["", "![evaluation](evals.png)", ""]
    for name, plan in (plans or {}).items():
        png = f"memory-{name}.png"
        plot_memory(plan, out / png)
        rec = plan["recommended"]
        lines += [f"## Plan: {name}", "", f"Recommended: **{rec['layout']['describe']}**", ""]
        lines += [f"- {e}" for e in plan.get("explanation", [])]
        lines += ["", f"![memory {name}]({png})", ""]
    for title, body in extra_sections:
        lines += [f"## {title}", "", body.rstrip(), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("python -m recipes report", __doc__)
    ap.add_argument("--metrics", required=True, help="metrics.jsonl of a training run")
    ap.add_argument("--plan", action="append", default=[], help="planner --json output (repeatable)")
    ap.add_argument("--out", required=True)
    ns = ap.parse_args(argv)
    plans = {Path(p).stem: json.loads(Path(p).read_text()) for p in ns.plan}
    print(write_report(ns.out, metrics=ns.metrics, plans=plans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

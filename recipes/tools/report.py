"""Run report: a Markdown page with the recipe, the plan, measured throughput/MFU and PNG plots.

Inputs are files the other stages already write (the training run's metrics.jsonl, the planner's --json output), so
a report can be rebuilt for any finished run: `python -m recipes.tools.report --metrics LOGDIR/metrics.jsonl --plan plan.json
--out DIR`.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the report is files, never a window
import matplotlib.pyplot as plt  # noqa: E402

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


def plot_losses(train: list[dict], valid: list[dict], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss", lw=1.2)
    if valid:
        ax.plot([r["step"] for r in valid], [r["val_loss"] for r in valid], "o-", label="validation loss")
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


def plot_memory(plan: dict, out: Path, top: int = 10) -> Path:
    """Stacked bars of the planner's predicted memory per GPU for the best `top` layouts (+ the GPU's capacity)."""
    rows = plan["ranked"][:top]
    labels = [_short(r["layout"]) for r in rows]
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
        f"- validation: " + (", ".join(f"step {r['step']}: {r['val_loss']:.4f} (ppl {r['val_ppl']:.1f})"
                                       for r in valid) or "none"),
        f"- median step time {s['median_step_time_s']:.3f} s, {s['median_tokens_per_s']:,.0f} tokens/s, "
        f"{s['median_tflops_per_gpu'] * 1e3:.2f} GFLOP/s per rank, MFU {s['median_mfu']:.1%} of the recipe's "
        f"cluster.peak_tflops",
        f"- skipped (non-finite) steps: {s['skipped_steps']}",
        "", "![loss](loss.png)", "", "![throughput](throughput.png)", "",
    ]
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
    ap = argparse.ArgumentParser(prog="python -m recipes.tools.report", description=__doc__.split("\n")[0])
    ap.add_argument("--metrics", required=True, help="metrics.jsonl of a training run")
    ap.add_argument("--plan", action="append", default=[], help="planner --json output (repeatable)")
    ap.add_argument("--out", required=True)
    ns = ap.parse_args(argv)
    plans = {Path(p).stem: json.loads(Path(p).read_text()) for p in ns.plan}
    print(write_report(ns.out, metrics=ns.metrics, plans=plans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""plan: what preparing a corpus of a given size costs, from a short calibration on a sample.

Calibration runs the real encoder (fast path included) on one core over a sample of the corpus (or the embedded
stdlib sample) and measures bytes per token, bytes per document and MB/s per core. From those and the corpus size it
prints expected tokens, shards, output size, wall time per cluster size, and how many of those tokens a training run
can consume (compute-bound: 6 x params FLOPs per token at a given MFU; and the Chinchilla 20 tokens/param rule).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Dict, List, Optional

import yaml

from data_prep.steps.fast_path import FastEncoder
from data_prep.steps.tokenizers import load_tokenizer, optimal_dtype

# The one hardware table: the cluster presets the recipes planner prices layouts with (configs/clusters/*.yaml, each
# naming its `gpu` and `peak_tflops`). Read as files: data_prep imports nothing from recipes. Found like
# recipes.config.loading finds configs/: next to this checkout, else in the working directory.
_CHECKOUT_CLUSTERS = Path(__file__).resolve().parents[2] / "configs" / "clusters"
CLUSTERS_DIR = _CHECKOUT_CLUSTERS if _CHECKOUT_CLUSTERS.is_dir() else Path.cwd() / "configs" / "clusters"
DEFAULT_GPU = "H100-80GB"  # the recipe schema's default cluster.gpu


def gpu_peaks(clusters_dir: Optional[Path] = None) -> Dict[str, float]:
    """GPU name -> dense bf16 peak FLOP/s, from every GPU cluster preset (CPU presets left out)."""
    table = {}
    for path in sorted(Path(clusters_dir or CLUSTERS_DIR).glob("*.yaml")):
        c = (yaml.safe_load(path.read_text()) or {}).get("cluster") or {}
        if c.get("device", "cuda") != "cpu" and c.get("gpu") and c.get("peak_tflops"):
            table[str(c["gpu"])] = float(c["peak_tflops"]) * 1e12
    return table


def peak_flops(gpu: str, clusters_dir: Optional[Path] = None) -> float:
    """The peak of a preset's GPU by its name (`A100-80GB`, any case), or by its family (`A100`) when every preset of
    that family has the same peak; ValueError naming the known GPUs otherwise (never a guess)."""
    table = gpu_peaks(clusters_dir)
    want = gpu.strip().lower()
    match = [n for n in table if n.lower() == want] or [n for n in table if n.lower().split("-")[0] == want]
    if match and len({table[n] for n in match}) == 1:
        return table[match[0]]
    where = Path(clusters_dir or CLUSTERS_DIR)
    known = ", ".join(sorted(table)) or f"none (no cluster preset found in {where})"
    raise ValueError(f"--gpu {gpu}: unknown GPU; known: {known} (from the cluster presets {where}/*.yaml, the table "
                     "the recipes planner uses; add a preset for another GPU)")


def calibrate(sample_inputs: List[str], tokenizer: str, max_bytes: int = 8 << 20, text_field: str = "text") -> Dict:
    from data_prep.steps.train_tokenizer import sample_texts

    tok = load_tokenizer(tokenizer)
    enc = FastEncoder(tok)
    texts = list(sample_texts(sample_inputs, text_field, max_bytes))
    enc.self_check(texts[:32])
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 128):
        tokens += sum(len(x) + 1 for x in enc.encode_batch(texts[i : i + 128]))
    secs = time.perf_counter() - t0
    return {"sample_bytes": nbytes, "sample_docs": len(texts), "tokens": tokens, "seconds": secs,
            "bytes_per_token": nbytes / tokens, "bytes_per_doc": nbytes / max(len(texts), 1),
            "mb_per_s_per_core": nbytes / secs / 1e6, "fast_path": enc.active, "vocab_size": tok.info.vocab_size}


def plan(corpus_bytes: float, cal: Dict, nodes_options: List[int], cores_per_node: int, shard_bytes: int,
         model_params: float = 0.0, gpus: int = 0, gpu: str = DEFAULT_GPU, mfu: float = 0.4, days: float = 30.0,
         efficiency: float = 0.8) -> str:
    itemsize = 2 if optimal_dtype(cal["vocab_size"]).__name__ == "uint16" else 4
    tokens = corpus_bytes / cal["bytes_per_token"]
    docs = corpus_bytes / cal["bytes_per_doc"]
    shards = math.ceil(corpus_bytes / shard_bytes)
    out_bytes = tokens * itemsize + docs * (4 + 8 + 8)  # tokens + per-sequence length, pointer, doc index
    lines = [
        f"calibration: {cal['sample_bytes'] / 1e6:.1f} MB sample, {cal['bytes_per_token']:.2f} bytes/token, "
        f"{cal['mb_per_s_per_core']:.2f} MB/s per core (fast path {'on' if cal['fast_path'] else 'off'})",
        f"corpus: {_h(corpus_bytes)}B -> about {_h(tokens)} tokens, {_h(docs)} documents",
        f"output: {shards:,} shards of ~{_h(shard_bytes)}B input each, {_h(out_bytes)}B on disk "
        f"({itemsize}-byte tokens); a blend over more than 32,767 shards needs `merge` first",
        "wall time (at {:.0%} parallel efficiency):".format(efficiency),
    ]
    per_core = cal["mb_per_s_per_core"] * 1e6 * efficiency
    for n in nodes_options:
        secs = corpus_bytes / (per_core * n * cores_per_node)
        lines.append(f"  {n:5d} node(s) x {cores_per_node} cores: {_duration(secs)}")
    lines.append(f"  core-years: {corpus_bytes / (cal['mb_per_s_per_core'] * 1e6) / 3.156e7:,.1f}")
    if model_params:
        chin = 20 * model_params
        lines.append(f"training a {_h(model_params)}-parameter model:")
        lines.append(f"  Chinchilla-optimal (20 tokens/param): {_h(chin)} tokens = {chin / tokens:.2%} of this corpus")
        if gpus:
            flops = gpus * peak_flops(gpu) * mfu * days * 86400
            budget = flops / (6 * model_params)
            lines.append(f"  compute budget {gpus} x {gpu} at {mfu:.0%} MFU for {days:g} days: {_h(budget)} tokens "
                         f"= {budget / tokens:.2%} of this corpus")
    return "\n".join(lines)


def _h(x: float) -> str:
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:.0f} "


def _duration(secs: float) -> str:
    if secs < 3600:
        return f"{secs / 60:.1f} min"
    if secs < 86400 * 2:
        return f"{secs / 3600:.1f} h"
    if secs < 86400 * 365:
        return f"{secs / 86400:.1f} days"
    return f"{secs / 86400 / 365:.1f} years"

"""blend: a weighted blend over one or more manifests for megatron-core's BlendedMegatronDatasetBuilder.

Each source gets a weight (normalized to sum 1); inside a source, shards are weighted by their tokens. Prints the
implied epochs per source for a token budget. megatron-core limits a blend to 32,767 prefixes: past that, merge the
biggest sources first (the message says which and to what size).
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

from data_prep.write.manifest import read_manifest

MAX_PREFIXES = 32767


def parse_sources(specs: List[str]) -> List[Tuple[str, str, float]]:
    """``name=DIR:weight`` or ``DIR:weight`` or ``DIR`` (weight 1)."""
    out = []
    for spec in specs:
        name, _, rest = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path, sep, w = rest.rpartition(":")
        if not sep or not _is_number(w):
            path, w = rest, "1"
        out.append((name or os.path.basename(os.path.normpath(path)), path, float(w)))
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def build_blend(sources: List[Tuple[str, str, float]], token_budget: float = 0.0) -> Dict:
    total_w = sum(w for _, _, w in sources)
    if total_w <= 0:
        raise ValueError("blend weights must sum to a positive number")
    blend, report, nprefix = [], [], 0
    for name, path, w in sources:
        m = read_manifest(path)
        tokens = m["totals"]["tokens"]
        share = w / total_w
        nprefix += len(m["shards"])
        for sh in m["shards"]:
            blend += [share * sh["tokens"] / tokens, os.path.join(os.path.abspath(path), sh["prefix"])]
        epochs = token_budget * share / tokens if token_budget and tokens else None
        report.append({"source": name, "path": os.path.abspath(path), "weight": share, "tokens": tokens,
                       "shards": len(m["shards"]), "epochs": epochs})
    if nprefix > MAX_PREFIXES:
        big = max(report, key=lambda r: r["shards"])
        target = max(1, sum(r["tokens"] for r in report) * 2 // (MAX_PREFIXES // 2))  # x2: bytes per uint16 token
        raise ValueError(
            f"the blend has {nprefix} prefixes; megatron-core accepts at most {MAX_PREFIXES}. Merge the sources "
            f"first, e.g. `python -m data_prep merge {big['path']} -o {big['path']}_merged --target-size "
            f"{max(target, 1 << 30) >> 20}M` (largest source: {big['source']}, {big['shards']} shards)")
    return {"blend": blend, "sources": report, "token_budget": token_budget or None, "prefixes": nprefix}


def format_report(b: Dict) -> str:
    lines = [f"{'source':12s} {'weight':>7s} {'tokens':>16s} {'shards':>7s} {'epochs':>8s}"]
    for r in b["sources"]:
        ep = f"{r['epochs']:8.2f}" if r["epochs"] is not None else "       -"
        warn = "  (repeats data: > 1 epoch)" if r["epochs"] and r["epochs"] > 1 else ""
        lines.append(f"{r['source']:12s} {r['weight']:7.3f} {r['tokens']:16,d} {r['shards']:7d} {ep}{warn}")
    lines.append(f"{b['prefixes']} prefixes (megatron-core limit {MAX_PREFIXES})")
    return "\n".join(lines)

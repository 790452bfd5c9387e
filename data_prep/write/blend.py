"""blend: a weighted blend over one or more manifests for megatron-core's BlendedMegatronDatasetBuilder.

Each source gets a weight (normalized to sum 1); inside a source, shards are weighted by their tokens. Prints the
implied epochs per source for a token budget. megatron-core limits a blend to 32,767 prefixes: past that, merge the
biggest sources first (the message says which and to what size).
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Tuple

from data_prep.write.manifest import output_dir_of, read_manifest

MAX_PREFIXES = 32767


def parse_sources(specs: List[str]) -> List[Tuple[str, str, float]]:
    """``name=DIR:weight`` or ``DIR:weight`` or ``DIR`` (weight 1). Either every source has a weight or none does
    (equal weights): a missing one would silently weigh 1 next to weights like 0.7. Weights are finite and >= 0,
    with a positive sum; names are unique. Raises ValueError naming the source and the fix."""
    out, weighted = [], []
    for spec in specs:
        name, _, rest = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path, sep, w = rest.rpartition(":")
        if not sep or os.path.isdir(rest):  # no weight (a directory whose name holds ':' included)
            path, w = rest, None
        label = name or os.path.basename(os.path.normpath(path))
        out.append((label, path, 1.0 if w is None else _weight(spec, label, w)))
        weighted.append(w is not None)
    if any(weighted) and not all(weighted):
        bare = [src for (src, _, _), has in zip(out, weighted) if not has]
        raise ValueError(f"blend: {', '.join(bare)} {'has' if len(bare) == 1 else 'have'} no weight while other "
                         "sources do (it would weigh 1.0 next to them): give every source a weight "
                         "(name=DIR:weight), or none for equal weights")
    _check_weights(out)
    return out


def _weight(spec: str, label: str, text: str) -> float:
    try:
        w = float(text)
    except ValueError:
        raise ValueError(f"blend: the weight {text!r} of {label} ({spec}) is not a number; write name=DIR:weight, "
                         "e.g. web=out/web:0.7") from None
    if not math.isfinite(w) or w < 0:
        raise ValueError(f"blend: the weight of {label} is {text}; weights are shares of the training tokens, "
                         "finite and >= 0 (e.g. web=out/web:0.7 code=out/code:0.3)")
    return w


def _check_weights(sources: List[Tuple[str, str, float]]) -> None:
    names = [n for n, _, _ in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"blend: the source name {twice[0]} is given twice; name each source once (name=DIR:weight)")
    if sum(w for _, _, w in sources) <= 0:
        raise ValueError("blend: the weights sum to 0; give the sources positive weights (they are normalized to "
                         "sum 1, e.g. web=out/web:0.7 code=out/code:0.3)")
    zero = [n for n, _, w in sources if w == 0]
    if zero:
        raise ValueError(f"blend: {', '.join(zero)} has weight 0; leave it out of the blend instead (megatron-core "
                         "would build an empty dataset for it)")


def build_blend(sources: List[Tuple[str, str, float]], token_budget: float = 0.0) -> Dict:
    _check_weights(sources)
    total_w = sum(w for _, _, w in sources)
    blend, report, nprefix = [], [], 0
    first_tok = None
    for name, path, w in sources:
        path = output_dir_of(path)
        m = read_manifest(path)
        first_tok = _check_source(name, path, m, first_tok)
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


def _check_source(name: str, path: str, m: Dict, first: Optional[Tuple[str, Dict]]) -> Tuple[str, Dict]:
    """A source must hold tokens (else its weight would silently go to the others: megatron-core normalizes what it
    is given) and share the first source's tokenizer (ids of two vocabularies cannot be mixed)."""
    if not m["shards"] or not m["totals"]["tokens"]:
        raise ValueError(f"blend: {name} ({path}) has no documents (0 shards); its weight would silently go to the "
                         f"other sources: rebuild it (its rejects.jsonl says why it is empty) or leave it out")
    tok = m.get("tokenizer", {})
    if first is not None and tok.get("sha256") != first[1].get("sha256"):
        raise ValueError(f"blend: {name} ({path}) was tokenized with {tok.get('path', '?')} but {first[0]} with "
                         f"{first[1].get('path', '?')}; a blend needs one tokenizer: re-tokenize one of them")
    return first or (name, tok)


def format_report(b: Dict) -> str:
    lines = [f"{'source':12s} {'weight':>7s} {'tokens':>16s} {'shards':>7s} {'epochs':>8s}"]
    for r in b["sources"]:
        ep = f"{r['epochs']:8.2f}" if r["epochs"] is not None else "       -"
        warn = "  (repeats data: > 1 epoch)" if r["epochs"] and r["epochs"] > 1 else ""
        lines.append(f"{r['source']:12s} {r['weight']:7.3f} {r['tokens']:16,d} {r['shards']:7d} {ep}{warn}")
    lines.append(f"{b['prefixes']} prefixes (megatron-core limit {MAX_PREFIXES})")
    return "\n".join(lines)

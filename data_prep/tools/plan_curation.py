"""plan, curation part: what the filter and dedup stages cost and keep, measured on a sample like tokenization is.

``calibrate_curation`` runs the real passes (steps/curate.py: hash, bucket, cluster, filter) in this one process over
the sample, cut into work units as a run would, and times each: MB/s per core of each stage (input text bytes over the
stage's CPU seconds: steady on a shared machine; waits for the disk are not counted; the compiled kernels, MinHash's
band layout and the tables are loaded before the clock starts, and that one-off cost per process is reported apart;
the sample is cut into work units of the run's size), the share of documents and of text bytes kept, per step.
``curation_lines`` turns that into node-hours for the whole corpus and the tokens left to tokenize.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Dict, List, Optional

import orjson

DEFAULT_STEPS = {"steps": [{"quality": {}}, {"exact_dedup": {}}, {"minhash_dedup": {"threshold": 0.8}}],
                 "buckets": 16}


def _write_sample(sample_inputs: List[str], max_bytes: int, text_field: str, d: str) -> int:
    from data_prep.steps.train_tokenizer import sample_texts

    nbytes = 0
    with open(os.path.join(d, "sample.jsonl"), "wb") as f:
        for t in sample_texts(sample_inputs, text_field, max_bytes):
            f.write(orjson.dumps({"text": t}) + b"\n")
            nbytes += len(t.encode("utf-8", "surrogatepass"))
    return nbytes


def calibrate_curation(sample_inputs: List[str], steps=None, max_bytes: int = 4 << 20,
                       text_field: str = "text", unit_bytes: int = 256_000_000) -> Dict:
    """Time each curation pass on one core over a sample (at most ``max_bytes`` of text), cut into work units of
    the run's ``unit_bytes`` (plan's --shard-size): a unit's own costs (its files, their fsync, its marker: ~5 ms
    of CPU in the hash pass) are then charged as often per byte as the run pays them, or more (a sample smaller
    than one unit), not once per MB."""
    from data_prep.curate import context
    from data_prep.read.units import list_inputs, plan_units
    from data_prep.steps import curate as cu
    from data_prep.steps.step_list import step_list

    sl = step_list(steps if steps is not None else DEFAULT_STEPS)
    with tempfile.TemporaryDirectory(prefix="data_prep_plan_curate_") as d:
        inp, out = os.path.join(d, "in"), os.path.join(d, "out")
        os.makedirs(inp)
        os.makedirs(out)
        nbytes = _write_sample(sample_inputs, max_bytes, text_field, inp)
        units = plan_units(list_inputs([inp]), unit_bytes)
        ctx = context(out, sl, units, "text", unit_bytes, 64 << 20, records=True)
        secs: Dict[str, float] = {}
        t0 = time.process_time()
        cu.load_step_resources(sl)  # fixed costs per process (run start-up), not per byte: outside the rates
        start_up = time.process_time() - t0

        def timed(stage, fn, items):
            t0 = time.process_time()
            for it in items:
                res = fn(it, ctx)
                if not res.get("ok", True):
                    raise RuntimeError(f"calibration failed on {res.get('path')}: {res.get('error')}")
            secs[stage] = secs.get(stage, 0.0) + time.process_time() - t0

        if sl.dedup_steps:
            os.makedirs(ctx.dedup_dir, exist_ok=True)
            timed("dedup hash pass", cu.hash_unit, units)
            timed("dedup bucket pass", cu.bucket_task, [cu.Bucket(b) for b in range(sl.buckets)])
            t0 = time.process_time()
            cu.cluster_pass(ctx)
            secs["dedup cluster pass"] = time.process_time() - t0
        records = kept = 0
        kept_bytes = 0
        removed: Dict[str, int] = {}
        t0 = time.process_time()
        for u in units:
            st = cu.filter_unit(u, ctx)["stats"]
            records += st["input_records"] - sum(st["rejected"].values())
            kept += st["documents"]
            for step, reasons in st["removed"].items():
                removed[step] = removed.get(step, 0) + sum(reasons.values())
        secs["filter pass"] = time.process_time() - t0
        for u in units:
            with open(cu.curated_path(out, u.name), "rb") as f:
                kept_bytes += sum(len(orjson.loads(line)["text"].encode("utf-8", "surrogatepass")) for line in f)
    total = sum(secs.values())
    return {"sample_bytes": nbytes, "units": len(units), "unit_bytes": unit_bytes, "documents": records,
            "kept_documents": kept,
            "kept_doc_fraction": kept / max(records, 1), "kept_byte_fraction": kept_bytes / max(nbytes, 1),
            "removed": removed, "steps": [s.name for s in sl.steps],
            "stages": {k: nbytes / v / 1e6 for k, v in secs.items()},  # MB/s per core
            "mb_per_s_per_core": nbytes / total / 1e6, "kernel_start_up_s": start_up}


def curation_lines(corpus_bytes: float, cal: Dict, nodes_options: List[int], cores_per_node: int,
                   efficiency: float = 0.8, tokenize_mb_per_s: Optional[float] = None,
                   bytes_per_token: Optional[float] = None) -> List[str]:
    lines = [f"curation ({' -> '.join(cal['steps'])}), calibrated on {cal['sample_bytes'] / 1e6:.1f} MB "
             f"({cal['units']} work unit(s) of up to {_h(cal['unit_bytes'])}B), one core:"]
    for stage, rate in cal["stages"].items():
        lines.append(f"  {stage:20s} {rate:8.2f} MB/s per core   {corpus_bytes / (rate * 1e6) / 3600:14,.0f} "
                     "core-hours")
    lines.append(f"  {'all curation passes':20s} {cal['mb_per_s_per_core']:8.2f} MB/s per core   "
                 f"{corpus_bytes / (cal['mb_per_s_per_core'] * 1e6) / 3600:14,.0f} core-hours")
    if cal.get("kernel_start_up_s") is not None:
        lines.append(f"  (and once per process: {cal['kernel_start_up_s']:.2f} CPU s to load the compiled kernels)")
    removed = ", ".join(f"{k} {v / max(cal['documents'], 1):.1%}" for k, v in cal["removed"].items()) or "nothing"
    kept = corpus_bytes * cal["kept_byte_fraction"]
    lines.append(f"  kept on the sample: {cal['kept_doc_fraction']:.1%} of documents, "
                 f"{cal['kept_byte_fraction']:.1%} of text bytes (removed: {removed}) -> {_h(kept)}B of this corpus "
                 "left to tokenize" + (f", about {_h(kept / bytes_per_token)} tokens" if bytes_per_token else ""))
    per_node = cal["mb_per_s_per_core"] * 1e6 * efficiency * cores_per_node
    tok_part = ""
    lines.append(f"  node-hours for the whole corpus (curation{' + tokenizing what is kept' if tokenize_mb_per_s else ''}"
                 f", {efficiency:.0%} parallel efficiency, {cores_per_node} cores per node):")
    for n in nodes_options:
        secs = corpus_bytes / (per_node * n)
        if tokenize_mb_per_s:
            tsecs = kept / (tokenize_mb_per_s * 1e6 * efficiency * cores_per_node * n)
            tok_part = f" + tokenize {tsecs / 3600:,.1f} h = {(secs + tsecs) / 3600 * n:,.0f} node-hours in all"
        lines.append(f"    {n:5d} node(s): curation {secs / 3600:,.1f} h ({secs / 3600 * n:,.0f} node-hours)"
                     f"{tok_part}")
    return lines


def _h(x: float) -> str:
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:.0f} "

"""Per-unit stats (completion markers) -> manifest.json, with the blend megatron-core's dataset builder takes.

Each unit writes ``shard_NNNNNN.stats.json`` atomically after its shard: that file is the unit's completion marker.
The manifest is merged from those files in unit order, so it is the same whatever the number of workers.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import List, Optional

from data_prep import io
from data_prep.write.rejects import REJECTS
from data_prep.write.removals import REMOVED, add_removed, removed_count

MANIFEST = "manifest.json"
FAILED = "failed_units.json"


def dumps(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode()


def stats_path(out_dir: str, unit_name: str) -> str:
    return io.join(out_dir, unit_name + ".stats.json")


def error_path(out_dir: str, unit_name: str) -> str:
    return io.join(out_dir, unit_name + ".error.json")


def load_error(out_dir: str, unit_name: str) -> Optional[dict]:
    try:
        with io.open_read(error_path(out_dir, unit_name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_stats(out_dir: str, unit_name: str) -> Optional[dict]:
    try:
        with io.open_read(stats_path(out_dir, unit_name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def build_manifest(out_dir: str, stats: List[dict], tokenizer: dict, dtype: str, settings: dict) -> dict:
    shards, empty = [], []
    tot_rej: Counter = Counter()
    records = docs = tokens = 0
    removed: dict = {}  # curation (--steps): documents removed by filter/dedup steps, by step and reason
    for s in stats:
        records += s["input_records"]
        docs += s["documents"]
        tokens += s["tokens"]
        tot_rej.update(s["rejected"])
        entry = {k: s[k] for k in ("prefix", "documents", "sequences", "tokens", "bytes", "sha256_bin", "sha256_idx",
                                   "idx_bytes", "input_records", "inputs", "rejected")}
        if "removed" in s:
            entry["removed"] = s["removed"]
            add_removed(removed, s["removed"])
        (shards if s["documents"] > 0 else empty).append(entry)
    blend = []
    for sh in shards:
        blend += [sh["tokens"], sh["prefix"]]
    manifest = {
        "format": "megatron-mmidx",
        "version": 1,
        "tokenizer": tokenizer,
        "dtype": dtype,
        "settings": settings,
        "shards": shards,
        "empty_units": empty,
        "totals": {
            "input_records": records,
            "documents": docs,
            "tokens": tokens,
            "shards": len(shards),
            "bytes": sum(sh["bytes"] for sh in shards),
            "rejected": dict(sorted(tot_rej.items())),
        },
        "blend": blend,
        "reject_log": REJECTS,
    }
    if any("removed" in s for s in stats):
        manifest["totals"]["removed"] = {k: dict(sorted(v.items())) for k, v in sorted(removed.items())}
        manifest["removal_log"] = REMOVED
    if records != docs + sum(tot_rej.values()) + removed_count(removed):
        raise AssertionError(f"manifest does not balance: {records} records != {docs} documents + {dict(tot_rej)}")
    return manifest


def read_manifest(out_dir: str) -> dict:
    path = io.join(out_dir, MANIFEST)
    if not io.exists(path):
        failed = io.join(out_dir, FAILED)
        hint = f" ({FAILED} lists units that failed; fix them and rerun tokenize)" if io.exists(failed) else ""
        raise FileNotFoundError(f"{path} not found: the run is not complete{hint}")
    with io.open_read(path) as f:
        return json.load(f)

"""Per-unit stats (completion markers) -> manifest.json, with the blend megatron-core's dataset builder takes.

Each unit writes ``shard_NNNNNN.stats.json`` atomically after its shard: that file is the unit's completion marker.
The manifest is merged from those files in unit order, so it is the same whatever the number of workers.
"""

from __future__ import annotations

import json
import os
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


# What every reader of a manifest relies on (verify, blend, merge, stats); verify also needs dtype and the vocabulary
REQUIRED = {"tokenizer": dict, "shards": list, "totals": dict}


class ManifestError(ValueError):
    """A manifest.json that cannot be read or lacks what a reader needs: one line naming the file and the fix."""


def output_dir_of(path: str) -> str:
    """An output directory from what a user gives for one: the directory, or its manifest.json."""
    if not io.is_url(path) and os.path.basename(path.rstrip("/")) == MANIFEST and os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path))
    return path


def read_manifest(out_dir: str) -> dict:
    """``out_dir``'s manifest.json; FileNotFoundError when the run is not complete, ManifestError (naming the file,
    the line and column, and the fix) when it is not a readable data_prep manifest."""
    path = io.join(out_dir, MANIFEST)
    if not io.exists(path):
        failed = io.join(out_dir, FAILED)
        hint = f" ({FAILED} lists units that failed; fix them and rerun tokenize)" if io.exists(failed) else ""
        raise FileNotFoundError(f"{path} not found: the run is not complete{hint}")
    fix = ("rewrite it: rerun the tokenize (or merge) that wrote it with the same arguments; its complete units are "
           "kept and the manifest is written again")
    try:
        with io.open_read(path) as f:
            m = json.load(f)
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}): the manifest is damaged; "
                            f"{fix}") from None
    except UnicodeDecodeError as e:
        raise ManifestError(f"{path}: not valid JSON (not UTF-8 text at byte {e.start}): the manifest is damaged; "
                            f"{fix}") from None
    wrong = [k for k, kind in REQUIRED.items() if not isinstance(m, dict) or not isinstance(m.get(k), kind)]
    if wrong:
        raise ManifestError(f"{path}: not a data_prep manifest ({', '.join(wrong)} missing or of the wrong type); "
                            f"{fix}")
    return m

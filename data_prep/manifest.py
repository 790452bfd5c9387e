"""Per-unit stats -> manifest.json (+ rejects.jsonl), and the blend megatron-core's dataset builder takes.

Each unit writes ``shard_NNNNNN.stats.json`` atomically after its shard: that file is the unit's completion marker.
The manifest is merged from those files in unit order, so it is the same whatever the number of workers.
"""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from typing import List, Optional

MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"
FAILED = "failed_units.json"


def _tmp_name(path: str, shared: bool) -> str:
    # Files of one unit have one writer: a fixed temporary name, overwritten by a rerun. Shared files (plan,
    # manifest, reject log) may be written by several nodes at once: a name per writer (host, pid).
    return f"{path}.tmp.{socket.gethostname()}.{os.getpid()}" if shared else path + ".tmp"


def remove_stale_tmp(out_dir: str) -> None:
    """Remove temporary files left by killed writers of this host (other hosts' files are left alone)."""
    host = socket.gethostname()
    for name in os.listdir(out_dir):
        head, sep, pid = name.rpartition(".")
        if not sep or not pid.isdigit() or not head.endswith(f".tmp.{host}"):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.remove(os.path.join(out_dir, name))
            except FileNotFoundError:
                pass
        except PermissionError:
            pass


def atomic_write(path: str, data: bytes, shared: bool = False) -> None:
    tmp = _tmp_name(path, shared)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_unless_identical(tmp: str, path: str) -> bool:
    """Move a finished ``tmp`` over ``path``, unless ``path`` already holds the same bytes: then keep it (and its
    mtime, which work-unit keys include, so a rerun that regenerates the same file resumes instead of redoing)."""
    import filecmp

    if os.path.exists(path) and filecmp.cmp(tmp, path, shallow=False):
        os.remove(tmp)
        return False
    os.replace(tmp, path)
    return True


def dumps(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode()


def stats_path(out_dir: str, unit_name: str) -> str:
    return os.path.join(out_dir, unit_name + ".stats.json")


def rejects_path(out_dir: str, unit_name: str) -> str:
    return os.path.join(out_dir, unit_name + ".rejects.jsonl")


def error_path(out_dir: str, unit_name: str) -> str:
    return os.path.join(out_dir, unit_name + ".error.json")


def load_error(out_dir: str, unit_name: str) -> Optional[dict]:
    try:
        with open(error_path(out_dir, unit_name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_stats(out_dir: str, unit_name: str) -> Optional[dict]:
    try:
        with open(stats_path(out_dir, unit_name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def build_manifest(out_dir: str, stats: List[dict], tokenizer: dict, dtype: str, settings: dict) -> dict:
    shards, empty = [], []
    tot_rej: Counter = Counter()
    records = docs = tokens = 0
    for s in stats:
        records += s["input_records"]
        docs += s["documents"]
        tokens += s["tokens"]
        tot_rej.update(s["rejected"])
        entry = {k: s[k] for k in ("prefix", "documents", "sequences", "tokens", "bytes", "sha256_bin", "sha256_idx",
                                   "idx_bytes", "input_records", "inputs", "rejected")}
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
    if records != docs + sum(tot_rej.values()):
        raise AssertionError(f"manifest does not balance: {records} records != {docs} documents + {dict(tot_rej)}")
    return manifest


def merge_reject_logs(out_dir: str, unit_names: List[str]) -> None:
    tmp = _tmp_name(os.path.join(out_dir, REJECTS), shared=True)
    with open(tmp, "wb") as out:
        for name in unit_names:
            p = rejects_path(out_dir, name)
            if os.path.exists(p):
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        out.write(block)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, os.path.join(out_dir, REJECTS))


def read_manifest(out_dir: str) -> dict:
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        failed = os.path.join(out_dir, FAILED)
        hint = f" ({FAILED} lists units that failed; fix them and rerun tokenize)" if os.path.exists(failed) else ""
        raise FileNotFoundError(f"{path} not found: the run is not complete{hint}")
    with open(path) as f:
        return json.load(f)

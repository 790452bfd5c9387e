"""merge: many shards -> fewer shards of a target size, by streaming (memory ~ one chunk, never the data).

Shards are taken in manifest order and grouped greedily up to ``target_bytes`` of .bin each; the new manifest keeps
the totals, the rejected counts and the input ranges of every source shard, so it still balances.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import List

import data_prep.write.manifest as mf
from data_prep.write.removals import add_removed
from data_prep import io
from data_prep.write.shards import ShardWriter, append_shard
from data_prep.write.verify import REBUILD, ShardIntegrityError, check_recorded


def merge(sources: List[str], out_dir: str, target_bytes: int, quiet: bool = False, overwrite: bool = False) -> dict:
    """Merge the shards of one or more manifest directories (same tokenizer) into ``out_dir``. A finished output
    there (its manifest.json) is refused unless ``overwrite`` (then its manifest goes first), and so is a source as
    the output (its shards would be read while merged shards are written beside them)."""
    out_dir = os.path.abspath(out_dir)
    manifests = [(os.path.abspath(d), mf.read_manifest(d)) for d in sources]
    if out_dir in (d for d, _ in manifests):
        raise ValueError(f"merge: -o {out_dir} is one of the sources; write the merged shards to a new directory "
                         f"(e.g. -o {out_dir}_merged)")
    if os.path.exists(os.path.join(out_dir, mf.MANIFEST)):
        same = _same_merge(out_dir, [d for d, _ in manifests], target_bytes)
        if not (same or overwrite):
            raise ValueError(f"merge: {out_dir} holds a finished output ({mf.MANIFEST}) of other sources or another "
                             "--target-size; rerun with --overwrite to replace it, or choose another -o")
        io.remove(os.path.join(out_dir, mf.MANIFEST))  # nothing may look complete while its shards are replaced
    os.makedirs(out_dir, exist_ok=True)
    first = manifests[0][1]
    for d, m in manifests[1:]:
        if m["tokenizer"].get("sha256") != first["tokenizer"].get("sha256") or m["dtype"] != first["dtype"]:
            raise ValueError(f"{d}: tokenizer or dtype differs from {manifests[0][0]}; merge only shards of one "
                             "tokenizer")
    items = [(d, sh) for d, m in manifests for sh in m["shards"]]
    groups, cur, size = [], [], 0
    for d, sh in items:
        if cur and size + sh["bytes"] > target_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append((d, sh))
        size += sh["bytes"]
    if cur:
        groups.append(cur)
    stats = []
    from tqdm import tqdm

    for i, group in enumerate(tqdm(groups, desc="merge", unit="shard", disable=quiet)):
        name = f"merged_{i:06d}"
        w = ShardWriter(os.path.join(out_dir, name), first["dtype"])
        rejected: Counter = Counter()
        removed: dict = {}  # curation (--steps) removals, carried so the merged manifest still balances
        inputs, records = [], 0
        for d, sh in group:
            _append_checked(w, os.path.join(d, sh["prefix"]), sh)
            rejected.update(sh.get("rejected", {}))
            add_removed(removed, sh.get("removed", {}))
            inputs += sh.get("inputs", [])
            records += sh.get("input_records", sh["documents"] + sum(sh.get("rejected", {}).values()))
        st = w.finalize()
        stats.append({"prefix": name, **st, "input_records": records, "inputs": inputs,
                      "rejected": dict(sorted(rejected.items())),
                      "merged_from": [os.path.join(d, sh["prefix"]) for d, sh in group],
                      **({"removed": {k: dict(sorted(v.items())) for k, v in sorted(removed.items())}}
                         if removed else {})})
    # units that produced no shard still count (their records were all rejected)
    for d, m in manifests:
        for e in m.get("empty_units", []):
            stats.append({"prefix": None, "documents": 0, "sequences": 0, "tokens": 0, "bytes": 0, "idx_bytes": 0,
                          "sha256_bin": None, "sha256_idx": None, "input_records": e["input_records"],
                          "inputs": e["inputs"], "rejected": e["rejected"],
                          **({"removed": e["removed"]} if "removed" in e else {})})
    manifest = mf.build_manifest(out_dir, stats, first["tokenizer"], first["dtype"],
                                 {**first.get("settings", {}), "merged_from": [d for d, _ in manifests],
                                  "merge_target_bytes": target_bytes})
    for i, sh in enumerate(s for s in stats if s["prefix"]):
        manifest["shards"][i]["merged_from"] = sh["merged_from"]
    io.atomic_write(os.path.join(out_dir, mf.MANIFEST), mf.dumps(manifest), shared=True)
    return manifest


def _append_checked(writer: ShardWriter, prefix: str, shard: dict) -> None:
    """Append one source shard after checking its .idx (and the .bin size it implies) against its manifest, and its
    .bin's sha256 as it is copied: a damaged source is refused, naming the file, not merged under a fresh checksum."""
    problems = check_recorded(prefix, shard.get("sha256_idx"))
    if problems:
        writer.abort()
        raise ShardIntegrityError(f"merge: {problems[0]}")
    got = append_shard(writer, prefix)
    if shard.get("sha256_bin") and got != shard["sha256_bin"]:
        writer.abort()
        raise ShardIntegrityError(f"merge: {prefix}.bin: sha256 does not match its manifest "
                                  f"({shard['sha256_bin'][:12]}...): the tokens were damaged; {REBUILD}")


def _same_merge(out_dir: str, sources: List[str], target_bytes: int) -> bool:
    """Whether ``out_dir`` holds a merge of these sources at this target size (a rerun writes the same shards)."""
    try:
        settings = mf.read_manifest(out_dir).get("settings") or {}
    except ValueError:
        return True  # an unreadable manifest finishes nothing: rewriting it loses nothing
    return settings.get("merged_from") == sources and settings.get("merge_target_bytes") == target_bytes

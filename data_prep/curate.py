"""curate: inputs -> work units -> filter and dedup steps (a YAML step list) -> kept documents, removal log, manifest.

The driver, beside pipeline.py (tokenize) and built the same way: plan the units, skip what has a valid completion
marker, run the rest on an executor (executors/: local pool, Ray; slices for Slurm/hostfile), one pass at a time:

1. hash pass, per unit (only with dedup steps): keys into hash-partitioned buckets (steps/curate.py, steps/dedup.py);
2. bucket pass, per bucket: the owner of each bucket picks keepers (smallest ref) and confirms MinHash pairs;
3. cluster pass (MinHash only, one task): union-find over the confirmed pairs;
4. filter pass, per unit: the steps in order; kept documents written as jsonl (``--format jsonl``) or, through
   ``tokenize --steps``, tokenized directly (pipeline.py calls ``prepare`` below, then its tokenize step consults the
   same DocGate).

Every marker carries a fingerprint of the settings, the step list and every unit's input key: dedup is global, so a
changed input anywhere redoes the passes, and an unchanged rerun skips everything that is complete. The output is the
same bytes whatever the worker count or engine (ordering by ref, never by arrival).

Slices (``--slice I/N``, one per node or Slurm array task) run one pass at a time with ``--stage hash|buckets|filter``:
the hash and filter stages take the units of the slice, the bucket stage the buckets of the slice; the cluster pass
and the manifest are done by whichever run of the filter stage finds every marker in place (or ``--stage filter
--merge-only``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Union

import orjson

import data_prep.write.manifest as mf
from data_prep import io
from data_prep.executors.base import UnitsFailed, WorkerDied, select_slice
from data_prep.executors.choose import make_executor, session as executor_session
from data_prep.progress import Progress
from data_prep.read.units import Unit, list_inputs, plan_units
from data_prep.settings import DEFAULT_MAX_RECORD, STAGES, check_locations
from data_prep.steps import curate as cu
from data_prep.steps.step_list import StepList, step_list
from data_prep.write.rejects import REJECTS, merge_reject_logs
from data_prep.write.removals import REMOVED, add_removed, merge_removal_logs, removed_count

log = logging.getLogger(__name__)

CURATION_MANIFEST = "curation.json"


@dataclass
class CurateSettings:
    inputs: List[str]
    output_dir: str
    steps: Union[str, dict, StepList]
    text_field: str = "text"
    workers: int = 1
    shard_size: Optional[int] = None  # input bytes per work unit; None: unit_size() of the corpus
    max_record_size: int = DEFAULT_MAX_RECORD
    executor: str = "local"
    ray_address: Optional[str] = None
    quiet: bool = False
    slice_index: int = 0
    slice_count: int = 1
    stage: str = "all"
    merge_only: bool = False

    def __post_init__(self) -> None:
        self.check_locations()

    def check_locations(self) -> None:
        """No credentials in a URL, and a POSIX output (the passes exchange buckets through it with renames)."""
        check_locations(self.inputs, self.output_dir, "curate")


# The default plan cuts a corpus into about this many units (each at least MIN_UNIT, at most MAX_UNIT): a small
# corpus still gives every core of a node work, and the plan, hence the output's bytes, depends on the corpus alone,
# never on -j or --slice (every slice, the finalize job and a rerun with another -j compute the same plan).
DEFAULT_UNITS = 128
MIN_UNIT, MAX_UNIT = 16 << 20, 256 << 20


def unit_size(pieces, shard_size: Optional[int]) -> int:
    """``--shard-size`` when given, else the corpus's input bytes over DEFAULT_UNITS, within [MIN_UNIT, MAX_UNIT]."""
    if shard_size is not None:
        return shard_size
    total = sum(io.size(p.path) for p in pieces)
    return max(MIN_UNIT, min(MAX_UNIT, -(-total // DEFAULT_UNITS)))


def plan(settings: "CurateSettings") -> List[Unit]:
    pieces = list_inputs(settings.inputs)
    return plan_units(pieces, unit_size(pieces, settings.shard_size))


def _file_digest(path: str) -> str:
    """SHA-256 of a file a step reads; a missing one is reported by the step itself when it loads."""
    try:
        return io.file_sha256(path)
    except OSError:
        return "missing"


def context(output_dir: str, steps: StepList, units: Sequence[Unit], text_field: str, shard_size: int,
            max_record_size: int, extra: Optional[dict] = None, records: bool = False) -> cu.CurateContext:
    """The tasks' context; its fingerprint covers everything that changes what the passes write. ``records``: the
    caller writes kept documents back as records (curate); tokenize --steps (False) refuses steps that rewrite."""
    check_locations([], output_dir, "curation steps")  # the tasks build POSIX paths under it (steps/curate.py)
    if not records:
        steps.check_tokenize()
    desc = {"steps": steps.as_dict(), "text_field": text_field, "shard_size": shard_size,
            "max_record_size": max_record_size, "units": [u.key() for u in units],
            "step_files": {p: _file_digest(p) for p in steps.resource_files()}}
    fp = hashlib.sha256(orjson.dumps(desc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return cu.CurateContext(output_dir=output_dir, steps=steps, fp=fp, units=len(units), text_field=text_field,
                            max_record_size=max_record_size, extra=extra or {})


def _run_tasks(kind: str, workers: int, ray_address, task: Callable, items: list, quiet: bool, desc: str,
               sizes: Optional[dict] = None) -> List[dict]:
    """Run ``task`` on ``items`` on the chosen executor; the failed ones, sorted by name."""
    failed = []

    def on_result(item, res) -> None:
        bar.unit_done(item.index)
        if isinstance(res, WorkerDied):
            res = {"ok": False, "unit": item.name, "path": "", "error": res.why}
        if not res["ok"]:
            failed.append({k: res[k] for k in ("unit", "path", "error")})
            bar.write(f"FAILED {res['unit']}: {res['path']}: {res['error']}")

    if not items:
        return []
    executor = make_executor(kind, workers, ray_address)
    with Progress(sizes or {i.index: i.nbytes for i in items}, quiet=quiet, desc=desc) as bar:
        executor.run(task, items, on_result, bar)
    return sorted(failed, key=lambda f: f["unit"])


def _raise_failed(failed: List[dict], what: str) -> None:
    lines = "\n".join(f"  {f['unit']}: {f['path']}: {f['error']}" for f in failed[:50])
    raise UnitsFailed(f"{len(failed)} {what} failed; the others are complete; rerun the same command to retry "
                         f"them:\n{lines}", failed)


def prepare(ctx: cu.CurateContext, units: List[Unit], settings, stage: str = "all") -> bool:
    """The dedup passes (hash, buckets, cluster) for this slice, skipping complete work. True when every pass is
    complete for the whole plan, so the filter pass can run; False when other slices still have work to do."""
    cu.load_step_resources(ctx.steps)  # once here, inherited by the forked workers
    if not ctx.steps.dedup_steps:
        return True
    os.makedirs(ctx.dedup_dir, exist_ok=True)
    buckets = [cu.Bucket(b) for b in range(ctx.steps.buckets)]
    passes = (("hash", units, cu.hash_marker, cu.hash_unit, "unit(s)", "unit(s) have no hash pass yet"),
              ("buckets", buckets, cu.bucket_marker, cu.bucket_task, "bucket(s)", "bucket(s) are not done yet"))
    for name, items, marker, task, what, not_done in passes:
        if not _pass(ctx, settings, stage, name, items, marker, task, what, not_done):
            return False
    if cu.marker_ok(cu.cluster_marker(ctx), ctx.fp) is None:
        cu.cluster_pass(ctx)
    return True


def _pass(ctx, settings, stage: str, name: str, items, marker, task, what: str, not_done: str) -> bool:
    """Run this slice's share of one dedup pass (unless another --stage was asked for), then check the whole pass:
    True when every item of it is complete."""
    def done(item) -> bool:
        return cu.marker_ok(marker(ctx, item.index), ctx.fp) is not None

    if stage in ("all", name) and not settings.merge_only:
        todo = [i for i in select_slice(items, settings.slice_index, settings.slice_count) if not done(i)]
        failed = _run_tasks(settings.executor, settings.workers, settings.ray_address,
                            functools.partial(task, ctx=ctx), todo, settings.quiet, f"dedup: {name}")
        if failed:
            _raise_failed(failed, what)
    missing = [i.name for i in items if not done(i)]
    if missing:
        _waiting(settings, stage, name, f"{len(missing)} {not_done} (first: {missing[0]})")
        return False
    return True


def _waiting(settings, stage: str, missing_stage: str, what: str) -> None:
    """Work of ``missing_stage`` is missing after this run did its share. Normal for a slice whose peers are still at
    the same stage; an error when nothing will come to do it: a whole run, --merge-only, or a --stage that was
    started before every slice finished the earlier stage (a Slurm chain or prep.sh never does that)."""
    if settings.merge_only:
        raise UnitsFailed(f"dedup: {what}; run the --stage {missing_stage} of every slice first (or the whole "
                             "command without --merge-only)", [])
    if stage == "all" and settings.slice_count == 1:
        raise UnitsFailed(f"dedup: {what}; rerun the same command", [])
    if stage != "all" and STAGES.index(missing_stage) < STAGES.index(stage):
        raise UnitsFailed(f"dedup: {what}: --stage {stage} needs --stage {missing_stage} of every slice "
                             "complete first", [])
    if not settings.quiet:
        log.info(f"data_prep curate: {what}; other slices (or the earlier --stage) must finish first")


def run(settings: CurateSettings) -> Optional[dict]:
    """Curate (this slice of) the units; returns curation.json's content once every unit is complete, else None.
    Its passes share one executor (one private Ray instance for the whole command)."""
    with executor_session():
        return _run(settings)


def _run(settings: CurateSettings) -> Optional[dict]:
    if settings.stage not in STAGES:
        raise ValueError(f"--stage must be one of {', '.join(STAGES)}, got {settings.stage!r}")
    settings.check_locations()  # before the output is probed
    steps = step_list(settings.steps)
    out = settings.output_dir = io.abspath(settings.output_dir)
    io.check_writable(out)
    io.remove_stale_tmp(out)
    if os.path.isdir(os.path.join(out, cu.DEDUP_DIR)):  # the dedup passes' arrays are written there, atomically too
        io.remove_stale_tmp(os.path.join(out, cu.DEDUP_DIR))
    units = plan(settings)
    ctx = context(out, steps, units, settings.text_field, settings.shard_size, settings.max_record_size, records=True)
    if not settings.quiet:
        log.info(f"data_prep curate: {len(units)} units, steps: {', '.join(s.name for s in steps.steps)}; "
                 f"{settings.workers} worker(s) on {settings.executor}")
    if not prepare(ctx, units, settings, settings.stage):
        return None
    if settings.stage in ("hash", "buckets"):
        return None
    done = {}
    todo = []
    for u in select_slice(units, settings.slice_index, settings.slice_count):
        st = unit_complete(ctx, u)
        if st is not None:
            done[u.name] = st
        elif not settings.merge_only:
            todo.append(u)
    manifest_path = os.path.join(out, CURATION_MANIFEST)
    if todo:
        io.remove(manifest_path)
    failed = _run_tasks(settings.executor, settings.workers, settings.ray_address,
                        functools.partial(cu.filter_unit, ctx=ctx), todo, settings.quiet, "filter")
    if failed:
        _raise_failed(failed, "unit(s)")
    missing = []
    for u in units:
        if u.name not in done:
            st = unit_complete(ctx, u)
            if st is None:
                missing.append(u.name)
            else:
                done[u.name] = st
    if missing:
        if settings.merge_only or settings.slice_count == 1:
            raise UnitsFailed(f"{len(missing)} unit(s) are not complete (first: {missing[0]}); rerun curate "
                                 "(same arguments) to do them", [])
        return None
    manifest = build_manifest(ctx, [done[u.name] for u in units])
    merge_removal_logs(out, [u.name for u in units])
    merge_reject_logs(out, [u.name for u in units])
    io.atomic_write(manifest_path, mf.dumps(manifest), shared=True)
    return manifest


def incomplete_dedup_slices(ctx: cu.CurateContext, units: Sequence[Unit], tasks: int) -> dict:
    """For a Slurm resubmission: the slices (of ``tasks``) with work left in the hash and in the bucket stage."""
    if not ctx.steps.dedup_steps:
        return {"hash": [], "buckets": []}
    return {"hash": sorted({u.index % tasks for u in units
                            if cu.marker_ok(cu.hash_marker(ctx, u.index), ctx.fp) is None}),
            "buckets": sorted({b % tasks for b in range(ctx.steps.buckets)
                               if cu.marker_ok(cu.bucket_marker(ctx, b), ctx.fp) is None})}


def incomplete_slices(settings: CurateSettings, tasks: int) -> dict:
    """Stage -> the slices (of ``tasks``) with work left in it (``slurm --only-incomplete`` of ``curate``)."""
    settings.check_locations()
    steps = step_list(settings.steps)
    out = io.abspath(settings.output_dir)
    units = plan(settings)
    ctx = context(out, steps, units, settings.text_field, settings.shard_size, settings.max_record_size, records=True)
    todo = incomplete_dedup_slices(ctx, units, tasks)
    todo["filter"] = sorted({u.index % tasks for u in units if unit_complete(ctx, u) is None})
    return todo


def unit_complete(ctx: cu.CurateContext, unit: Unit) -> Optional[dict]:
    st = cu.marker_ok(cu.stats_path(ctx.output_dir, unit.name), ctx.fp)
    if st is None or st.get("key") != unit.key():
        return None
    try:
        if io.size(cu.curated_path(ctx.output_dir, unit.name)) != st["bytes"]:
            return None
    except OSError:
        return None
    return st


def build_manifest(ctx: cu.CurateContext, stats: List[dict]) -> dict:
    records = docs = 0
    rejected: Counter = Counter()
    removed: dict = {}
    modified: dict = {}
    for s in stats:
        records += s["input_records"]
        docs += s["documents"]
        rejected.update(s["rejected"])
        add_removed(removed, s["removed"])
        add_removed(modified, s.get("modified", {}))
    removed = {k: dict(sorted(v.items())) for k, v in sorted(removed.items())}
    modified = {k: dict(sorted(v.items())) for k, v in sorted(modified.items())}
    manifest = {
        "format": "jsonl",
        "version": 1,
        "steps": ctx.steps.as_dict(),
        "settings": {"text_field": ctx.text_field, "max_record_size": ctx.max_record_size},
        "files": [{k: s.get(k, {}) for k in ("file", "bytes", "input_records", "documents", "inputs", "rejected",
                                              "removed", "modified")} for s in stats],
        "totals": {"input_records": records, "documents": docs, "bytes": sum(s["bytes"] for s in stats),
                   "rejected": dict(sorted(rejected.items())), "removed": removed, "modified": modified,
                   "kept_fraction": docs / max(records - sum(rejected.values()), 1)},
        "removal_log": REMOVED,
        "reject_log": REJECTS,
    }
    if records != docs + sum(rejected.values()) + removed_count(removed):
        raise AssertionError("curation manifest does not balance")
    return manifest

"""tokenize: inputs -> work units -> one shard per unit (each written by the worker that tokenized it) -> manifest.

The driver: plan the units, skip the complete ones, run the rest on an executor (executors/) with the tokenize step
(steps/tokenize.py) as the task, and write manifest.json once every unit is complete (write/manifest.py).

Resume: a unit whose stats file matches its input key and the settings fingerprint, with shard files of the recorded
sizes and a valid header, is skipped. Everything else is redone from scratch, writing to temporary names first, so a
run killed at any moment and rerun gives the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from typing import List, Optional

import numpy as np

import data_prep.write.manifest as mf
from data_prep import io
from data_prep.executors.base import UnitsFailed, WorkerDied, select_slice
from data_prep.executors.choose import make_executor
from data_prep.progress import Progress
from data_prep.read.probe import probe_inputs
from data_prep.read.units import Unit, list_inputs, plan_units
from data_prep.settings import INT32_MAX, STAGES, Settings, fingerprint, setting_changes
from data_prep.steps import tokenize
from data_prep.steps.fast_path import FastEncoder
from data_prep.steps.tokenizers import load_tokenizer, optimal_dtype
from data_prep.write.rejects import merge_reject_logs
from data_prep.write.removals import merge_removal_logs
from data_prep.write.shards import expected_idx_bytes, read_header
from data_prep.write.yield_check import NoUsableOutput, check_yield

log = logging.getLogger(__name__)


def _curate():
    """The curation driver, imported only by runs with --steps (pydantic, yaml and the dedup code: ~0.15 s of every
    tokenize start otherwise)."""
    from data_prep import curate

    return curate


def unit_is_complete(out_dir: str, unit: Unit, fp: str) -> Optional[dict]:
    st = mf.load_stats(out_dir, unit.name)
    if not st or st.get("fingerprint") != fp or st.get("key") != unit.key():
        return None
    if st["documents"] == 0:
        return st
    prefix = io.join(out_dir, unit.name)
    try:
        if io.size(prefix + ".bin") != st["bytes"] or io.size(prefix + ".idx") != st["idx_bytes"]:
            return None
        head = read_header(prefix + ".idx")
    except (OSError, ValueError):
        return None
    if head["sequences"] != st["sequences"] or head["document_count"] != st["documents"] + 1:
        return None
    if st["idx_bytes"] != expected_idx_bytes(st["sequences"], st["documents"]):
        return None
    return st


def run(settings: Settings, max_reject_fraction: float = 1.0) -> Optional[dict]:
    """Tokenize (this slice of) the units; returns the manifest once all units are complete, else None (a slice
    whose peers are still running). Raises UnitsFailed (after finishing the rest) if inputs failed, ProbeError before
    any work if the first inputs cannot give documents, NoUsableOutput (write/yield_check.py) instead of writing a
    manifest with no document or with more than ``max_reject_fraction`` of the records rejected."""
    settings.check_locations()  # before the tokenizer is loaded or the output probed
    if not 0.0 <= max_reject_fraction <= 1.0:
        raise ValueError(f"--max-reject-fraction must be in 0..1 (1: fail only when nothing is written), got "
                         f"{max_reject_fraction}")
    io.configure(settings.storage_options, settings.upload_part_size)
    settings.output_dir = io.abspath(settings.output_dir)
    run_here = functools.partial(_run, max_reject_fraction=max_reject_fraction)
    if not io.is_url(settings.output_dir):
        return run_here(settings)
    # A URL output: shards are written to a private local staging dir and uploaded from there; removed at the end,
    # so nothing a run started outlives it (--staging-dir picks the disk it is made on).
    parent = settings.staging_dir
    if parent:
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise ValueError(f"--staging-dir {parent} is a file; give a local directory for the shards before their "
                             "upload (default: the temp dir)")
        os.makedirs(parent, exist_ok=True)
    settings.staging_dir = tempfile.mkdtemp(prefix="data_prep-staging-", dir=parent)
    try:
        return run_here(settings)
    finally:
        shutil.rmtree(settings.staging_dir, ignore_errors=True)
        settings.staging_dir = parent


def _check_options(settings: Settings) -> None:
    if settings.long_docs not in ("split", "reject"):
        raise ValueError("--long-docs must be split or reject")
    if settings.max_record_size < 1:
        raise ValueError("--max-record-size must be positive (e.g. 64Mi)")
    if not 0 < settings.max_doc_tokens <= INT32_MAX:
        raise ValueError(f"--max-doc-tokens must be in 1..{INT32_MAX} (the format stores int32 lengths)")


def _plan(settings: Settings) -> List[Unit]:
    """The inputs listed, probed (unless this is a --merge-only run, which reads none) and cut into units."""
    pieces = list_inputs(settings.inputs, output=settings.output_dir)
    if not settings.merge_only:  # refuse a wrong --text-field or an unreadable input before any work
        probe_inputs(pieces, settings.text_field, settings.max_record_size)
    return plan_units(pieces, settings.shard_size)


def _run(settings: Settings, max_reject_fraction: float = 1.0) -> Optional[dict]:
    settings.tokenizer = os.path.abspath(settings.tokenizer) if settings.tokenizer else settings.tokenizer
    _check_options(settings)
    tok = load_tokenizer(settings.tokenizer, settings.eod_id)  # fail before any work if it is missing or broken
    info = tok.info
    dtype = np.dtype(optimal_dtype(info.vocab_size)).name
    io.check_writable(settings.output_dir)
    units = _plan(settings)
    out_settings = settings.output_affecting(info.sha256)
    ctx = _curation(settings, units, out_settings)
    if settings.stage not in STAGES:
        raise ValueError(f"--stage must be one of {', '.join(STAGES)}, got {settings.stage!r}")
    if settings.stage != "all" and ctx is None:
        raise ValueError(f"--stage {settings.stage} needs --steps (the stages are the curation passes)")
    fp = fingerprint(out_settings)
    manifest_path = io.join(settings.output_dir, mf.MANIFEST)
    _keep_finished(settings, out_settings, info.path, units)
    io.remove_stale_tmp(settings.output_dir)
    io.atomic_write(io.join(settings.output_dir, "plan.json"), shared=True, data=mf.dumps(
        {"fingerprint": fp, "settings": out_settings,
         "units": [{"name": u.name, "key": u.key(), "inputs": [p.as_dict() for p in u.pieces]} for u in units]}))

    mine = select_slice(units, settings.slice_index, settings.slice_count)
    _list_outputs(settings.output_dir)
    done = {}
    todo = []
    for u in mine:
        st = unit_is_complete(settings.output_dir, u, fp)
        if st is not None:
            done[u.name] = st
        elif not settings.merge_only:
            todo.append(u)
    if settings.stage in ("hash", "buckets"):  # one dedup pass of this slice (a Slurm array task, a prep.sh stage)
        if not settings.merge_only:
            _curate().prepare(ctx, units, settings, settings.stage)
        return None
    if todo:
        io.remove(manifest_path)  # nothing may look complete while units are redone
    if ctx is not None and (todo or settings.merge_only) and not _curate().prepare(ctx, units, settings,
                                                                                 settings.stage):
        return None  # dedup passes of other slices still to finish
    probe = FastEncoder(tok, enabled=settings.fast_path)
    # a local pool forks from here: the encoder is self-checked once, in this process (Ray tasks check their own)
    tokenize.preload(settings, tok, probe, todo[0] if todo and settings.executor == "local" else None)
    where = f" (slice {settings.slice_index}/{settings.slice_count})" if settings.slice_count > 1 else ""
    if not settings.quiet:
        log.info(f"data_prep: {len(units)} units{where}, {len(mine)} mine, {len(done)} already complete, "
                 f"{len(todo)} to do; {settings.workers} worker(s); fast path: "
                 f"{probe.describe()}")
    failed = _execute(todo, settings, fp, done)
    if failed:
        lines = "\n".join(f"  {f['unit']}: {f['path']}: {f['error']}" for f in failed)
        if settings.slice_count == 1:
            io.atomic_write(io.join(settings.output_dir, mf.FAILED), mf.dumps(failed), shared=True)
        raise UnitsFailed(f"{len(failed)} unit(s) failed; the other units are complete and a rerun keeps them. Fix "
                        "what a line says (a damaged input fails again as it is), then rerun the same command to "
                        f"redo these:\n{lines}", failed)
    return finish(settings.output_dir, units, fp, info, dtype, out_settings, done,
                  require_all=settings.merge_only or settings.slice_count == 1, quiet=settings.quiet,
                  work_dir=settings.work_dir(), max_reject_fraction=max_reject_fraction)


def _keep_finished(settings: Settings, out_settings: dict, tokenizer: str, units: List[Unit]) -> None:
    """A finished output (its manifest.json) made with other output-affecting settings is not replaced by a rerun:
    refused (ValueError, exit 2) naming each difference and --overwrite. With --overwrite its manifest goes first
    (nothing may look complete while shards are replaced), then its shards that the new plan does not write."""
    try:
        finished = mf.read_manifest(settings.output_dir)
    except (FileNotFoundError, ValueError):  # none, or unreadable: nothing finished to keep (a rerun rewrites it)
        return
    changes = setting_changes(finished.get("settings") or {}, out_settings,
                              ((finished.get("tokenizer") or {}).get("path", ""), tokenizer))
    if not changes:
        return
    if not settings.overwrite:
        raise ValueError(f"{settings.output_dir} holds a finished run ({mf.MANIFEST}) made with other settings: "
                         f"{'; '.join(changes)}. This run would replace its shards: rerun with --overwrite to "
                         "replace them, or choose another -o/--output")
    log.info(f"data_prep: --overwrite: replacing the finished run in {settings.output_dir} ({'; '.join(changes)})")
    io.remove(io.join(settings.output_dir, mf.MANIFEST))
    planned = {u.name for u in units}
    for shard in finished.get("shards", []) + finished.get("empty_units", []):
        if shard.get("prefix") and shard["prefix"] not in planned:
            for suffix in (".bin", ".idx", ".stats.json", ".rejects.jsonl"):
                io.remove(io.join(settings.output_dir, shard["prefix"] + suffix))


def _curation(settings: Settings, units: List[Unit], out_settings: dict):
    """With --steps: the curation context for the tokenize tasks, recorded in the output-affecting settings."""
    if not settings.steps:
        return None
    settings.check_locations()  # the curation passes need a POSIX output (settings.check_locations says why)
    from data_prep.steps.step_list import step_list

    steps = step_list(settings.steps)
    ctx = _curate().context(settings.output_dir, steps, units, settings.text_field, settings.shard_size,
                         settings.max_record_size)
    out_settings["curation"] = {"steps": steps.as_dict(), "fingerprint": ctx.fp}
    settings.curation = ctx
    return ctx


def _list_outputs(out_dir: str) -> None:
    """A URL output is listed once (paged) before its completion markers are checked, so a check costs no request
    per unit for what is absent and no HEAD per shard file; other nodes' markers written since are seen."""
    if io.is_url(out_dir):
        io.refresh_listing(out_dir)


def finish(out_dir, units, fp, info, dtype, out_settings, done, require_all=True, quiet=False,
           work_dir="", max_reject_fraction: float = 1.0) -> Optional[dict]:
    """Write manifest.json when every unit is complete (whichever slice or node gets here last does it).

    With ``require_all``, missing units raise UnitsFailed naming them and the error each recorded (if any). With every
    unit complete, a run with no document (or too many rejects) raises NoUsableOutput instead of writing it: this is
    the first place that sees the whole run's totals (write/yield_check.py says why not per unit or slice)."""
    _list_outputs(out_dir)  # workers (other processes, other nodes) wrote since: see their markers and logs
    missing = []
    for u in units:
        if u.name not in done:
            st = unit_is_complete(out_dir, u, fp)
            if st is None:
                missing.append(u)
            else:
                done[u.name] = st
    failed_path = io.join(out_dir, mf.FAILED)
    if missing:
        if not require_all:
            if not quiet:
                log.info(f"data_prep: this slice is complete; {len(missing)} unit(s) of other slices are not yet; "
                         "the last slice to finish (or --merge-only) writes manifest.json")
            return None
        failed = []
        for u in missing:
            err = mf.load_error(out_dir, u.name) or {}
            failed.append({"unit": u.name, "path": err.get("path", ", ".join(p.path for p in u.pieces)),
                           "error": err.get("error", "not run yet (or killed)")})
        io.atomic_write(failed_path, mf.dumps(failed), shared=True)
        lines = "\n".join(f"  {f['unit']}: {f['path']}: {f['error']}" for f in failed[:50])
        raise UnitsFailed(f"{len(missing)} unit(s) are not complete; rerun tokenize (same arguments) to do them:\n"
                        f"{lines}", failed)
    io.remove(failed_path)
    stats = [done[u.name] for u in units]
    manifest = mf.build_manifest(out_dir, stats, info.manifest_dict(), dtype, out_settings)
    merge_reject_logs(out_dir, [u.name for u in units], work_dir)
    if any("removed" in st for st in stats):
        merge_removal_logs(out_dir, [u.name for u in units], work_dir)
    try:
        check_yield(out_dir, stats, out_settings["text_field"], max_reject_fraction)
    except NoUsableOutput:
        io.remove(io.join(out_dir, mf.MANIFEST))  # an earlier run's: nothing may look complete
        raise
    io.atomic_write(io.join(out_dir, mf.MANIFEST), mf.dumps(manifest), shared=True)
    return manifest


def _execute(todo: List[Unit], settings: Settings, fp: str, done: dict) -> List[dict]:
    """Run the tokenize step on ``todo``; fills ``done`` (unit name -> stats); returns the failed units, sorted."""
    failed = []

    def on_result(unit: Unit, res) -> None:
        bar.unit_done(unit.index)
        if isinstance(res, WorkerDied):  # recorded like an unreadable input: this unit failed, the others go on
            res = {"ok": False, "unit": unit.name, "path": ", ".join(p.path for p in unit.pieces), "error": res.why}
            io.atomic_write(mf.error_path(settings.output_dir, unit.name),
                            mf.dumps({k: res[k] for k in ("unit", "path", "error")}))
        if res["ok"]:
            done[unit.name] = res["stats"]
        else:
            failed.append({k: res[k] for k in ("unit", "path", "error")})
            bar.write(f"FAILED {res['unit']}: {res['path']}: {res['error']}")

    executor = make_executor(settings.executor, settings.workers, settings.ray_address)
    task = functools.partial(tokenize.tokenize_unit, settings=settings, fp=fp)
    with Progress({u.index: u.nbytes for u in todo}, quiet=settings.quiet) as bar:
        executor.run(task, todo, on_result, bar)
    failed.sort(key=lambda f: f["unit"])
    return failed


def incomplete_slices(settings: Settings, tasks: int):
    """Slices (of ``tasks``) that still have a unit without a valid completion marker; with --steps, a dict: stage
    (hash, buckets, filter) -> its slices with work left."""
    settings.check_locations()  # before the tokenizer is loaded
    info = load_tokenizer(settings.tokenizer, settings.eod_id).info
    io.configure(settings.storage_options, settings.upload_part_size)
    units = plan_units(list_inputs(settings.inputs, output=settings.output_dir), settings.shard_size)
    out = io.abspath(settings.output_dir)
    settings.output_dir = out
    out_settings = settings.output_affecting(info.sha256)
    ctx = _curation(settings, units, out_settings)
    fp = fingerprint(out_settings)
    _list_outputs(out)
    todo = sorted({u.index % tasks for u in units if unit_is_complete(out, u, fp) is None})
    if ctx is None:
        return todo
    return {**_curate().incomplete_dedup_slices(ctx, units, tasks), "filter": todo}

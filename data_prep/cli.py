"""python -m data_prep <command>: tokenize, train-tokenizer, verify, stats/inspect, sample-corpus, demo, bench,
bench-executors, merge, blend, plan, slurm, probe, curate.

Exit codes: 0 done (or, for one slice of many, its share done); 1 units failed (the rest is complete: rerun to
retry them); 2 refused: a bad argument, an input that cannot give documents, no documents written or too many
rejected, storage without credentials or access (one line naming the file or URL and the fix)."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys

from data_prep import file_modes, io

def _size_arg(text: str) -> int:
    """argparse type for sizes (data_prep.io.parse_size: 64M, 1G, 10P, 512Mi, plain bytes), at least 1 byte."""
    try:
        size = io.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"wants a size of at least 1 byte (e.g. 256M), got {text!r}")
    return size


def _count_arg(least: int = 1):
    """argparse type for counts: a whole number of at least ``least`` (`-j 0` used to run with no worker limit
    check at all, `-j -2` likewise), refused by the parser with the value given."""
    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"wants a whole number of at least {least}, got {text!r}")
        return value

    return count


def _positive_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"wants a number above 0, got {text!r}")
    return value


def _nonnegative_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"wants a number of at least 0 (e.g. 2e12), got {text!r}")
    return value


def _share_arg(text: str) -> float:
    """A share in (0, 1] (e.g. --mfu 0.4): 0 would divide by zero."""
    value = _fraction_arg(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"wants a fraction above 0 and at most 1 (e.g. 0.4), got {text!r}")
    return value


def _fraction_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"wants a fraction in 0..1 (e.g. 0.5), got {text!r}")
    return value


def _file_mode_arg(text: str) -> int:
    """argparse type for --file-mode (data_prep.file_modes.parse: an octal mode, never world-writable)."""
    try:
        return file_modes.parse(text, "--file-mode")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_file_mode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--file-mode", type=_file_mode_arg, default=None, metavar="MODE",
                   help="mode of every file written (shards, .idx, stats, manifest, reject logs), e.g. 0640 or 0600 "
                        "on a shared file system; directories get x where r (0750, 0700). Default: 0644 as today")


def _add_tokenize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="files, directories or quoted globs (.jsonl/.json[.gz|.zst], .parquet, "
                                             ".txt, datasets save_to_disk directories)")
    p.add_argument("-o", "--output", required=True, help="output directory (shards, manifest.json, rejects.jsonl)")
    p.add_argument("-t", "--tokenizer", required=True, help="sentencepiece .model, tokenizer.json or a local "
                                                            "transformers directory")
    p.add_argument("--text-field", default="text", help="the record field (parquet/dataset column) holding the "
                                                         "document; checked on the first records before any work")
    p.add_argument("--max-reject-fraction", type=_fraction_arg, default=1.0, metavar="F",
                   help="fail (exit 2, no manifest) when more than this share of the records is rejected; the "
                        "default 1.0 fails only a run that writes no document")
    p.add_argument("-j", "--workers", type=_count_arg(1), default=max(1, (os.cpu_count() or 1)))
    p.add_argument("--shard-size", type=_size_arg, default="256M",
                   help="input bytes per work unit = per shard (e.g. 64M, 1G); big .jsonl files are split at "
                        "newlines, big parquet files at row groups, big saved datasets at rows")
    p.add_argument("--no-eod", dest="append_eod", action="store_false", help="do not append EOD to each document")
    p.add_argument("--bos", dest="add_bos", action="store_true", help="prepend the tokenizer's BOS")
    p.add_argument("--eod-id", type=_count_arg(0), default=None, help="override the end-of-document id")
    p.add_argument("--max-doc-tokens", type=_count_arg(1), default=2**31 - 1,
                   help="documents longer than this are split into several sequences, or rejected (--long-docs)")
    p.add_argument("--long-docs", choices=("split", "reject"), default="split")
    p.add_argument("--max-record-size", type=_size_arg, default="64Mi",
                   help="a record (jsonl line, .txt file; parquet/dataset text in characters) longer than this is "
                        "rejected as record_too_large without being held in memory (default 64Mi)")
    p.add_argument("--no-fast-path", dest="fast_path", action="store_false",
                   help="always encode whole documents (the fast path is used only where exact)")
    p.add_argument("--verify-fraction", type=_fraction_arg, default=0.0,
                   help="re-encode this share of documents whole during the run; stop on any mismatch")
    p.add_argument("--slice", type=parse_slice, default=(0, 1), metavar="I/N",
                   help="run only units with index %% N == I (one node of N); the last to finish writes the manifest")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: a process pool of --workers; ray: one Ray task per unit")
    p.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (e.g. auto, ray://head:10001); default: start a private local one "
                        "(loopback only, Ray token auth; RAY_ADDRESS alone is not followed)")
    p.add_argument("--merge-only", action="store_true",
                   help="do no unit work: write manifest.json if all units are complete, else list the missing ones")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished output (manifest.json) made with other settings (tokenizer, text field, "
                        "shard size...); without it such a rerun is refused and nothing is touched")
    p.add_argument("--storage-option", dest="storage_options", action="append", default=[], type=_storage_option,
                   metavar="NAME=VALUE", help="an fsspec option for URL inputs/outputs (s3://, gs://), e.g. "
                   "endpoint_url=http://minio:9000 for an S3-compatible store; repeatable. Credentials are never "
                   "options: they come from the provider's chain (env, ~/.aws, instance role)")
    p.add_argument("--staging-dir", default=None,
                   help="local directory for shards of a URL output before their upload (default: the temp dir)")
    p.add_argument("--upload-part-size", type=_size_arg, default="64Mi",
                   help="multipart upload part size for a URL output (S3: 5Mi..5Gi; default 64Mi)")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--steps", default=None, help="YAML step list of filters and dedup run before tokenizing "
                                                  "(as `curate`; see docs/curation.md)")
    p.add_argument("--stage", choices=("all", "hash", "buckets", "filter"), default="all",
                   help="with --steps and --slice: run one curation pass (filter: filter and tokenize); all slices "
                        "finish a stage before any starts the next (`slurm` and launch/prep.sh chain them)")
    _add_file_mode(p)


def _storage_option(text: str):
    """NAME=VALUE -> (name, value); true/false/null/numbers become JSON values, anything else stays a string."""
    import json

    from data_prep.objstore import check_options

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--storage-option wants NAME=VALUE (e.g. endpoint_url=http://host:9000), "
                                         f"got {text.split('=')[0]!r}...")
    try:
        parsed = json.loads(value)
        value = parsed if isinstance(parsed, (bool, int, float)) or parsed is None else value
    except ValueError:
        pass
    try:
        check_options({name: value})
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return name, value


def parse_slice(text: str):
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slice wants I/N (e.g. 0/4), got {text!r}")
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--slice {text}: need 0 <= I < N")
    return i, n


def cmd_tokenize(a) -> int:
    from data_prep.executors.base import UnitsFailed
    from data_prep.pipeline import run

    try:
        m = run(_settings_from(a), max_reject_fraction=a.max_reject_fraction)
    except UnitsFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if m is None:
        return 0
    t = m["totals"]
    print(f"{a.output}: {t['shards']} shards, {t['documents']:,} documents, {t['tokens']:,} tokens, "
          f"rejected {sum(t['rejected'].values()):,} {t['rejected'] or ''}"
          + (f", removed by steps {t['removed']}" if "removed" in t else ""))
    return 0


def cmd_train_tokenizer(a) -> int:
    from data_prep.steps.train_tokenizer import train

    path = train(a.inputs, a.model_prefix, a.vocab_size, a.model_type, a.text_field, a.sample_bytes,
                 quiet=a.quiet, normalization=a.normalization, overwrite=a.overwrite)
    print(path)
    return 0


def cmd_verify(a) -> int:
    from data_prep.write.manifest import ManifestError
    from data_prep.write.verify import verify

    from data_prep.write.manifest import output_dir_of

    a.dir = output_dir_of(a.dir)
    try:
        problems = verify(a.dir, checksums=not a.no_checksums)
    except ManifestError as e:  # a damaged manifest is a verification failure like a damaged shard
        problems = [str(e)]
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"{a.dir}: OK")
    return 0


def cmd_stats(a) -> int:
    from data_prep.tools.inspect_shards import summarize
    from data_prep.write.manifest import output_dir_of

    print(summarize(output_dir_of(a.dir), decode=a.decode))
    return 0


def cmd_sample_corpus(a) -> int:
    from data_prep.tools.sample_corpus import build

    print(build(a.out_dir, int(a.max_mb * 1e6)))
    return 0


def cmd_demo(a) -> int:
    from data_prep.tools.demo import demo

    return demo(a.out_dir, workers=a.workers, quiet=a.quiet, corpus_bytes=int(a.corpus_mb * 1e6),
                vocab_size=a.vocab_size)


def _bench_dir(given: str | None, name: str) -> str:
    """The bench's scratch directory: the one given, else a fresh private one (a fixed name in the shared /tmp could be
    made first by another user, as a link to where they want the bench to write)."""
    if given:
        return given
    import tempfile

    made = tempfile.mkdtemp(prefix=f"{name}-")
    print(f"bench scratch directory: {made}", file=sys.stderr)
    return made


def cmd_bench(a) -> int:
    from data_prep.tools.bench import bench

    return bench(_bench_dir(a.out_dir, "data_prep_bench"), corpus_mb=a.corpus_mb, workers=a.workers, scale=a.scale, vocab_size=a.vocab_size,
                 megatron_lm=a.megatron_lm, megatron_lm_fast=a.megatron_lm_fast, families=a.family)


def cmd_bench_datatrove(a) -> int:
    from data_prep.tools.bench_datatrove import bench_datatrove

    bench_datatrove(a.corpus, max_mb=a.max_mb, default_words_mb=a.default_words_mb, steps=a.steps or None)
    return 0


def cmd_bench_executors(a) -> int:
    from data_prep.tools.bench_executors import bench_executors

    return bench_executors(_bench_dir(a.out_dir, "data_prep_bench_executors"), corpus_mb=a.corpus_mb, workers=a.workers, shard_size=a.shard_size,
                           tokenizer=a.tokenizer, hostfile=a.hostfile)


def _tokenize_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep tokenize")
    _add_tokenize_args(p)
    return p


def _settings_from(a):
    """The run's Settings from parsed tokenize arguments."""
    from data_prep.settings import Settings

    return Settings(inputs=a.inputs, output_dir=a.output, tokenizer=a.tokenizer, text_field=a.text_field,
                    workers=a.workers, shard_size=a.shard_size, append_eod=a.append_eod, add_bos=a.add_bos,
                    eod_id=a.eod_id, max_doc_tokens=a.max_doc_tokens, long_docs=a.long_docs, fast_path=a.fast_path,
                    max_record_size=a.max_record_size,
                    verify_fraction=a.verify_fraction, quiet=a.quiet, slice_index=a.slice[0],
                    slice_count=a.slice[1], merge_only=a.merge_only, executor=a.executor, ray_address=a.ray_address,
                    storage_options=dict(a.storage_options), staging_dir=a.staging_dir,
                    upload_part_size=a.upload_part_size,
                    steps=a.steps, stage=a.stage, overwrite=a.overwrite)


def _forwarded(command_args: list, who: str):
    """(command, its arguments, parsed, settings) from the arguments after ``--`` of `slurm` or `probe`:
    ``[tokenize|curate] ARGS...`` (bare arguments are tokenize's). Raises ValueError (exit 2) when there are none or
    they carry a per-task flag."""
    args = command_args[1:] if command_args[:1] == ["--"] else command_args
    command = args[0] if args[:1] in (["tokenize"], ["curate"]) else "tokenize"  # bare arguments: tokenize's
    args = args[1:] if args[:1] == [command] else args
    if not args:
        raise ValueError("give the tokenize (or curate) arguments after --")
    for flag in ("--slice", "--stage", "--merge-only"):
        if any(x == flag or x.startswith(flag + "=") for x in args):
            raise ValueError(f"{flag} is set per task by `{who}`: remove it from the {command} arguments")
    if command == "curate":
        parsed = _curate_parser().parse_args(args)
        return command, args, parsed, _curate_settings_from(parsed)
    parsed = _tokenize_parser().parse_args(args)
    return command, args, parsed, _settings_from(parsed)


def _preflight(settings) -> list:
    """The inputs and the output probed once from here (executors/preflight.py), before anything is submitted."""
    from data_prep.executors.preflight import preflight
    from data_prep.objstore import UPLOAD_PART

    return preflight(settings.inputs, settings.output_dir, settings.text_field,
                     getattr(settings, "storage_options", None), getattr(settings, "upload_part_size", UPLOAD_PART),
                     settings.max_record_size)


def cmd_probe(a) -> int:
    """Probe the inputs and the output of a run as `slurm` does before submitting (for launch/prep.sh, or by hand)."""
    command, _, _, settings = _forwarded(a.command_args, "probe")
    for line in _preflight(settings):
        print(f"probed: {line}")
    print(f"{command}: the inputs can be read and the output written")
    return 0


def cmd_slurm(a) -> int:
    from data_prep.executors.slurm import render

    command, args, parsed, settings = _forwarded(a.command_args, "slurm")
    file_modes.apply(parsed.file_mode)  # the scripts and the tasks' log directory too (the tasks get the flag)
    # a 4,000-task array must not start for a bucket it cannot read or write, or a text field the inputs lack
    for line in _preflight(settings):
        print(f"# probed: {line}")
    if command == "curate":
        from data_prep.curate import incomplete_slices
    else:
        from data_prep.pipeline import incomplete_slices
    stages = ()
    if parsed.steps:  # the dedup passes are global: one array per pass, each after the previous
        from data_prep.executors.slurm import CURATION_STAGES
        from data_prep.steps.step_list import step_list

        stages = CURATION_STAGES if step_list(parsed.steps).dedup_steps else ("filter",)
    only = incomplete_slices(settings, a.tasks) if a.only_incomplete else None
    if only is not None and not any(only.values() if isinstance(only, dict) else only):
        print(f"every unit is complete: nothing to submit (run the finalize script or {command} --merge-only)")
        return 0
    paths = render(args, a.tasks, a.scripts_dir, sys.executable, os.getcwd(), a.max_array_size,
                   a.cpus_per_task, a.time, a.partition, a.max_concurrent, only, command=command, stages=stages,
                   account=a.account, qos=a.qos)
    for p in paths:
        print(f"# {p}")
        if a.dry_run:
            with open(p) as f:
                print(f.read())
    if a.dry_run:
        return 0
    import subprocess

    return subprocess.call(["bash", paths[-1]])


def cmd_merge(a) -> int:
    from data_prep.write.merge import merge

    from data_prep.write.manifest import output_dir_of

    m = merge([output_dir_of(d) for d in a.sources], a.output, a.target_size, quiet=a.quiet, overwrite=a.overwrite)
    t = m["totals"]
    print(f"{a.output}: {t['shards']} shards, {t['documents']:,} documents, {t['tokens']:,} tokens")
    return 0


def cmd_blend(a) -> int:
    import json

    from data_prep.write.blend import build_blend, format_report, parse_sources

    if a.output and os.path.isdir(a.output):
        raise ValueError(f"blend -o {a.output} is a directory; give the blend file to write, e.g. -o "
                         f"{os.path.join(a.output, 'blend.json')}")
    b = build_blend(parse_sources(a.sources), a.token_budget)
    print(format_report(b))
    if a.output:
        io.atomic_write(a.output, json.dumps(b, indent=1))
        print(f"blend written to {a.output} (key 'blend': megatron-core's [weight, prefix, ...] list)")
    return 0


def cmd_plan(a) -> int:
    import tempfile

    from data_prep.tools.plan import calibrate, peak_flops, plan

    if a.gpus:  # an unknown GPU is refused before any calibration, not priced as some other GPU
        peak_flops(a.gpu)
    if a.sample:  # read (and credentials) checked, and the text field, before any calibration
        _check_sample(a.sample, a.text_field)
    # a sample corpus and a tokenizer made for the plan last as long as the plan (~4 MB each call otherwise left)
    with tempfile.TemporaryDirectory(prefix="data_prep_plan_") as scratch:
        sample, tok = _plan_sample_and_tokenizer(a, scratch)
        cal = calibrate(sample, tok, io.parse_size(a.sample_size), text_field=a.text_field)
        print(plan(io.parse_size(a.corpus_size), cal, a.nodes, a.cores_per_node, a.shard_size, a.model_params,
                   a.gpus, a.gpu, a.mfu, a.days))
        if a.steps != "none":  # the filter and dedup stages (tools/plan_curation.py)
            from data_prep.tools.plan_curation import calibrate_curation, curation_lines

            ccal = calibrate_curation(sample, a.steps, io.parse_size(a.curation_sample_size), unit_bytes=a.shard_size)
            print("\n".join(curation_lines(io.parse_size(a.corpus_size), ccal, a.nodes, a.cores_per_node,
                                           tokenize_mb_per_s=cal["mb_per_s_per_core"],
                                           bytes_per_token=cal["bytes_per_token"])))
    return 0


def _plan_sample_and_tokenizer(a, scratch: str) -> tuple[list, str]:
    """The user's sample and tokenizer, or, for what is not given, the embedded sample corpus and a tokenizer trained
    on it, made in `scratch`."""
    from data_prep.steps.train_tokenizer import train
    from data_prep.tools.sample_corpus import build

    sample = a.sample or [build(scratch, 4 << 20)]
    tok = a.tokenizer or train(sample, os.path.join(scratch, "sp"), vocab_size=4000, quiet=True,
                               sample_bytes=4 << 20, text_field=a.text_field)
    return sample, tok


def _check_sample(sample: list, text_field: str) -> None:
    """The plan's sample must give documents: probed as a run's inputs, then at least one document read."""
    from data_prep.read.probe import probe_inputs
    from data_prep.read.units import list_inputs
    from data_prep.steps.train_tokenizer import sample_texts

    probe_inputs(list_inputs(sample), text_field)
    if next(iter(sample_texts(sample, text_field, 1)), None) is None:
        raise ValueError(f"--sample {' '.join(sample)}: no document in the sample (every record is empty or "
                         f"rejected with --text-field {text_field}); give files of the corpus with text in that field")


# --- curate: filter and dedup steps (data_prep/curate.py) ------------------------------------------------------------


def _add_curate_args(sub) -> None:
    p = sub.add_parser("curate", help="filter and dedup steps from a YAML step list -> kept documents as jsonl, "
                                      "removal log, curation.json")
    _add_curate_options(p)
    p.set_defaults(fn=cmd_curate)


def _curate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_prep curate")
    _add_curate_options(p)
    return p


def _add_curate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="files, directories or quoted globs (as tokenize)")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--steps", required=True, help="YAML step list (quality, exact_dedup, minhash_dedup)")
    p.add_argument("--text-field", default="text")
    p.add_argument("-j", "--workers", type=_count_arg(1), default=max(1, (os.cpu_count() or 1)))
    p.add_argument("--shard-size", type=_size_arg, default=None,
                   help="input bytes per work unit (default: the corpus in ~128 units of 16M-256M, whatever -j)")
    p.add_argument("--max-record-size", type=_size_arg, default="64Mi")
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster; default: a private local one (as tokenize)")
    p.add_argument("--slice", type=parse_slice, default=(0, 1), metavar="I/N",
                   help="this node's share: units (hash, filter) or buckets (buckets) with index %% N == I")
    p.add_argument("--stage", choices=("all", "hash", "buckets", "filter"), default="all",
                   help="with --slice: run one pass; all slices finish a stage before any starts the next")
    p.add_argument("--merge-only", action="store_true", help="write curation.json if every unit is complete")
    p.add_argument("-q", "--quiet", action="store_true")
    _add_file_mode(p)


def _curate_settings_from(a):
    from data_prep.curate import CurateSettings

    return CurateSettings(inputs=a.inputs, output_dir=a.output, steps=a.steps, text_field=a.text_field,
                          workers=a.workers, shard_size=a.shard_size, max_record_size=a.max_record_size,
                          executor=a.executor, ray_address=a.ray_address, quiet=a.quiet, slice_index=a.slice[0],
                          slice_count=a.slice[1], stage=a.stage, merge_only=a.merge_only)


def cmd_curate(a) -> int:
    from data_prep.curate import run
    from data_prep.executors.base import UnitsFailed

    try:
        m = run(_curate_settings_from(a))
    except UnitsFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if m is None:
        return 0
    t = m["totals"]
    removed = ", ".join(f"{step} {sum(r.values()):,} {r}" for step, r in t["removed"].items()) or "none"
    print(f"{a.output}: {len(m['files'])} files, {t['input_records']:,} records, kept {t['documents']:,} "
          f"({t['kept_fraction']:.1%}); removed: {removed}; rejected {sum(t['rejected'].values()):,}")
    return 0


def _version() -> str:
    """data_prep ships in the llm-recipes distribution: its version (pyproject.toml), from the install's metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"data_prep (llm-recipes {version('llm-recipes')})"
    except PackageNotFoundError:
        return "data_prep (llm-recipes, not installed: pip install -e .)"


def _log_to_stderr() -> None:
    """data_prep's diagnostics (what a run does, failed units) on stderr as plain lines; results stay on stdout."""
    logger = logging.getLogger("data_prep")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _log_to_stderr()
    ap = argparse.ArgumentParser(prog="python -m data_prep", description=__doc__)
    ap.add_argument("-V", "--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("tokenize", help="tokenize inputs into Megatron .bin/.idx shards + manifest.json")
    _add_tokenize_args(p)
    p.set_defaults(fn=cmd_tokenize)

    p = sub.add_parser("train-tokenizer", help="train a sentencepiece model (byte fallback) on a corpus sample")
    p.add_argument("inputs", nargs="+")
    p.add_argument("-o", "--model-prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    p.add_argument("--vocab-size", type=_count_arg(1), default=4000)
    p.add_argument("--model-type", choices=("bpe", "unigram"), default="bpe")
    p.add_argument("--text-field", default="text")
    p.add_argument("--sample-bytes", type=_size_arg, default="20M")
    p.add_argument("--normalization", choices=("identity", "nmt_nfkc"), default="identity",
                   help="identity (default): lossless, Llama-style; nmt_nfkc: sentencepiece's classic defaults")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing PREFIX.model that differs from the one trained now (without it such a "
                        "run is refused and the existing model kept; an identical rerun is fine)")
    p.add_argument("-q", "--quiet", action="store_true")
    _add_file_mode(p)
    p.set_defaults(fn=cmd_train_tokenizer)

    p = sub.add_parser("verify", help="check every shard with megatron-core's reader against the manifest")
    p.add_argument("dir")
    p.add_argument("--no-checksums", action="store_true", help="skip sha256 (structure checks only)")
    p.set_defaults(fn=cmd_verify)

    for name in ("stats", "inspect"):
        p = sub.add_parser(name, help="documents, tokens, length histogram, a few documents decoded")
        p.add_argument("dir")
        p.add_argument("--decode", type=_count_arg(0), default=2, help="documents to decode back to text")
        p.set_defaults(fn=cmd_stats)

    p = sub.add_parser("sample-corpus", help="write a real-text .jsonl from Python's standard library (PSF)")
    p.add_argument("out_dir")
    p.add_argument("--max-mb", type=_positive_arg, default=4.0, help="MB of text to write")
    p.set_defaults(fn=cmd_sample_corpus)

    p = sub.add_parser("demo", help="sample-corpus -> train-tokenizer -> tokenize -> verify -> stats")
    p.add_argument("out_dir", nargs="?", default="out/demo")
    p.add_argument("-j", "--workers", type=_count_arg(1), default=max(1, (os.cpu_count() or 1)))
    p.add_argument("--corpus-mb", type=_positive_arg, default=4.0)
    p.add_argument("--vocab-size", type=_count_arg(1), default=3000)
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("bench", help="per tokenizer family: the pipeline vs bare gigatoken vs the bare tokenizer vs "
                                     "Megatron-LM's preprocess_data.py and preprocess_data_fast.py (wall, CPU, MB/s, "
                                     "speed-ups, peak RSS)")
    p.add_argument("out_dir", nargs="?", default=None, help="scratch directory (default: a fresh private one)")
    p.add_argument("--corpus-mb", type=_positive_arg, default=32.0,
                   help="the corpus (web-page-sized documents from the installed docs and sources; up to ~500 MB)")
    p.add_argument("--scale", type=_count_arg(1), default=10, help="peak-RSS check on a corpus this many times bigger (1: off)")
    p.add_argument("-j", "--workers", type=_count_arg(1), default=max(1, (os.cpu_count() or 1)))
    p.add_argument("--vocab-size", type=_count_arg(1), default=32000, help="of the tokenizer trained per family")
    p.add_argument("--megatron-lm", default=None, metavar="PATH",
                   help="a Megatron-LM checkout: also time its tools/preprocess_data.py (and preprocess_data_fast.py "
                        "when it has one)")
    p.add_argument("--megatron-lm-fast", default=None, metavar="PATH",
                   help="another Megatron-LM checkout whose tools/preprocess_data_fast.py to time (e.g. main)")
    p.add_argument("--family", action="append", default=None, help="only this family (repeatable): " + ", ".join(
        ["'sp-bpe nmt_nfkc'", "'sp-bpe nfkc_cf'", "'sp-bpe identity (Llama-2 style)'",
         "'hf byte-level BPE (GPT-2 style)'"]))
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("bench-executors", help="local pool vs hostfile (ssh) vs Ray: wall, units/s, MB/s, "
                                               "MB/s per core, identical output")
    p.add_argument("out_dir", nargs="?", default=None, help="scratch directory (default: a fresh private one)")
    p.add_argument("--corpus-mb", type=_positive_arg, default=4.0)
    p.add_argument("-j", "--workers", type=_count_arg(1), default=max(1, (os.cpu_count() or 1)), help="workers in all")
    p.add_argument("--shard-size", type=_size_arg, default="256k", help="input bytes per work unit")
    p.add_argument("-t", "--tokenizer", default=None, help="default: train one on the sample corpus")
    p.add_argument("--hostfile", default=None, help="nodes for the hostfile case ('host slots=N' lines; default "
                                                    "$LAUNCH_HOSTFILE; ssh options from $LAUNCH_SSH_CONFIG); "
                                                    "skipped without one")
    p.set_defaults(fn=cmd_bench_executors)

    p = sub.add_parser("bench-datatrove", help="curation steps side by side with datatrove (installed apart): CPU "
                                               "MB/s per core per step, kept-set agreement")
    p.add_argument("corpus", help="a .jsonl corpus (text field 'text'), e.g. from data_prep.tools.web_corpus")
    p.add_argument("--max-mb", type=float, default=16.0, help="text read from the corpus")
    p.add_argument("--default-words-mb", type=float, default=1.0,
                   help="of it, run through datatrove with its default (spaCy) words too")
    p.add_argument("--steps", nargs="*", choices=("gopher", "c4", "fineweb", "pii", "language"))
    p.set_defaults(fn=cmd_bench_datatrove)

    p = sub.add_parser("merge", help="combine many shards into fewer of a target size, streaming")
    p.add_argument("sources", nargs="+", help="output directories (with manifest.json) of the same tokenizer")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--target-size", type=_size_arg, default="4G", help=".bin bytes per merged shard")
    p.add_argument("--overwrite", action="store_true", help="replace a finished output (manifest.json) in -o")
    p.add_argument("-q", "--quiet", action="store_true")
    _add_file_mode(p)
    p.set_defaults(fn=cmd_merge)

    p = sub.add_parser("blend", help="weighted blend over manifests (name=DIR:weight ...), epochs per source")
    p.add_argument("sources", nargs="+", help="name=DIR:weight, e.g. web=out/web:0.7 code=out/code:0.2")
    p.add_argument("--token-budget", type=_nonnegative_arg, default=0.0, help="training tokens, to report epochs per source")
    p.add_argument("-o", "--output", help="write the blend JSON here")
    _add_file_mode(p)
    p.set_defaults(fn=cmd_blend)

    p = sub.add_parser("plan", help="tokens, shards, size and wall time for a corpus, from a calibration run")
    p.add_argument("--corpus-size", required=True, help="e.g. 10P, 500T, 2G (bytes of text)")
    p.add_argument("--sample", nargs="*", help="sample files of the corpus (default: the embedded stdlib sample)")
    p.add_argument("-t", "--tokenizer", help="default: one trained on the sample")
    p.add_argument("--sample-size", default="8M")
    p.add_argument("--text-field", default="text", help="the field (column) of the sample holding the document")
    p.add_argument("--nodes", type=_count_arg(1), nargs="+", default=[1, 10, 100])
    p.add_argument("--cores-per-node", type=_count_arg(1), default=96)
    p.add_argument("--shard-size", type=_size_arg, default="256M")
    p.add_argument("--model-params", type=_nonnegative_arg, default=0.0, help="e.g. 130e9")
    p.add_argument("--gpus", type=_count_arg(0), default=0, help="GPUs of the training run (e.g. 800)")
    p.add_argument("--gpu", default="H100-80GB", help="the training GPU, as a cluster preset names it (A100-40GB, "
                   "A100-80GB, H100-80GB, H200-141GB; configs/clusters/*.yaml) or its family (A100, H100, H200)")
    p.add_argument("--mfu", type=_share_arg, default=0.4)
    p.add_argument("--days", type=_positive_arg, default=30.0)
    p.add_argument("--steps", default=None, help="curation step list to price (YAML); default: quality + "
                                                  "exact_dedup + minhash_dedup at their defaults; 'none' to skip")
    p.add_argument("--curation-sample-size", default="4M", help="text of the sample the curation passes run on")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("slurm", help="write (and submit) Slurm job arrays running tokenize or curate slices (with "
                                     "curation steps: one array per pass, chained afterok)")
    p.add_argument("--tasks", type=_count_arg(1), required=True, help="number of slices = array tasks")
    p.add_argument("--scripts-dir", default="runs/prep_slurm")
    p.add_argument("--max-array-size", type=_count_arg(1), default=1001, help="the cluster's MaxArraySize (scontrol show config)")
    p.add_argument("--max-concurrent", type=_count_arg(0), default=0, help="%%N throttle on running tasks")
    p.add_argument("--cpus-per-task", type=_count_arg(1), default=8)
    p.add_argument("--time", default="24:00:00", help="each task's time limit (sbatch --time)")
    p.add_argument("--partition", help="sbatch --partition (default: the cluster's default partition)")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--qos", help="sbatch --qos")
    p.add_argument("--only-incomplete", action="store_true",
                   help="submit only slices with incomplete units (with curation steps: per pass)")
    p.add_argument("--dry-run", action="store_true", help="write and print the scripts; submit nothing")
    p.add_argument("command_args", nargs=argparse.REMAINDER,
                   help="-- then the tokenize arguments, or -- curate and the curate arguments")
    p.set_defaults(fn=cmd_slurm)

    p = sub.add_parser("probe", help="probe a run's inputs and output once, as `slurm` does before submitting: "
                                     "list the inputs, read the first records (the text field), write and delete a "
                                     "probe object in the output; exit 2 with the fix if any fails")
    p.add_argument("command_args", nargs=argparse.REMAINDER,
                   help="-- then the tokenize arguments, or -- curate and the curate arguments")
    p.set_defaults(fn=cmd_probe)

    _add_curate_args(sub)

    a = ap.parse_args(argv)
    file_modes.apply(getattr(a, "file_mode", None))  # before anything is written, in this process and its workers
    from data_prep.steps.tokenizers import TokenizerError
    from data_prep.read.units import PlanError

    try:
        return a.fn(a)
    except (TokenizerError, PlanError, PermissionError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # a write of a shard, log or marker: no file name to show
            where = getattr(a, "output", None) or getattr(a, "out_dir", None) or "the output directory"
            print(f"error: no space left for {where} ({e.strerror}); no partial file was kept and nothing partial "
                  "looks complete: free space (or raise the quota) and rerun the same command (complete units "
                  "are kept, the others are redone)", file=sys.stderr)
            return 2
        print(f"error: {e.filename or ''}: {e.strerror or e} (nothing written for the failing unit looks "
              "complete; free space or fix the path and rerun)", file=sys.stderr)
        return 2

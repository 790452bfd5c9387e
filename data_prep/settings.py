"""The settings of a tokenize run, and the fingerprint of those that change the bytes written."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import orjson

from data_prep import io

INT32_MAX = 2**31 - 1
DEFAULT_MAX_RECORD = 64 << 20  # bytes of one record (--max-record-size): far above any real document
STAGES = ("all", "hash", "buckets", "filter")  # --stage: the curation passes of a sliced run


def check_locations(inputs: List[str], output_dir: str, steps_flag: Optional[str] = None) -> None:
    """Checked before anything is loaded, probed or rendered: no URL carries credentials, and with curation steps
    (``steps_flag``: "--steps", or "curate") the output is a POSIX directory. The curation passes exchange hash
    buckets and removal lists through the output directory with renames, which an object store does not have."""
    for path in inputs:
        io.check_url(path, "input")  # the positional INPUTS
    io.check_url(output_dir, "-o/--output")
    if steps_flag and io.is_url(io.abspath(output_dir)):
        raise ValueError(f"{steps_flag} with the output {output_dir}: the curation passes need a POSIX output "
                         "directory (a shared file system across nodes); curate into one (inputs may be URLs), then "
                         "tokenize or upload its output")


@dataclass
class Settings:
    inputs: List[str]
    output_dir: str
    tokenizer: str
    text_field: str = "text"
    workers: int = 1
    shard_size: int = 256 << 20  # input bytes per work unit (and so per shard)
    append_eod: bool = True
    add_bos: bool = False
    eod_id: Optional[int] = None
    max_doc_tokens: int = INT32_MAX
    long_docs: str = "split"  # split | reject
    fast_path: bool = True
    verify_fraction: float = 0.0
    batch_docs: int = 256
    slice_index: int = 0  # this node runs units with index % slice_count == slice_index
    slice_count: int = 1
    merge_only: bool = False  # do no unit work: write the manifest if all units are complete, else list them
    executor: str = "local"  # local (process pool) | ray (tasks on a Ray cluster)
    ray_address: Optional[str] = None  # None: start a local Ray instance; "auto" or ray://host:port: join one
    batch_chars: int = 1 << 20  # a batch also ends at this much text: memory stays flat whatever the documents
    quiet: bool = False
    max_record_size: int = DEFAULT_MAX_RECORD  # bytes of one record; a longer one is rejected, never held whole
    # object storage (URL inputs/outputs): fsspec options such as endpoint_url (never credentials: objstore.py),
    # the local directory shards are written to before their upload, and the multipart upload part size
    storage_options: Dict[str, object] = field(default_factory=dict)
    staging_dir: Optional[str] = None
    upload_part_size: int = 64 << 20
    # a finished output (manifest.json) made with other output-affecting settings is refused unless this is set
    overwrite: bool = False

    def work_dir(self) -> str:
        """Where this run's workers write shard files: the output directory itself, or for a URL output the local
        staging directory they are uploaded from."""
        return self.staging_dir if "://" in self.output_dir and self.staging_dir else self.output_dir

    # curation (data_prep/curate.py): a YAML step list of filters and dedup run before tokenizing (--steps); the
    # pipeline sets ``curation`` to the tasks' context (steps.curate.CurateContext) and records it in the fingerprint
    steps: Optional[str] = None
    curation: Optional[object] = None
    # with --steps and --slice: run one pass (hash | buckets | filter = the filter pass inside tokenize), as curate's
    # --stage; "all" runs whatever this slice can (data_prep/curate.py)
    stage: str = "all"

    def __post_init__(self) -> None:
        self.check_locations()

    def check_locations(self) -> None:
        check_locations(self.inputs, self.output_dir, "--steps" if self.steps else None)

    def output_affecting(self, tok_sha: str) -> dict:
        """The settings that change the bytes written (not workers, fast path, batch size or verbosity)."""
        return {
            "tokenizer_sha256": tok_sha,
            "text_field": self.text_field,
            "shard_size": self.shard_size,
            "append_eod": self.append_eod,
            "add_bos": self.add_bos,
            "eod_id": self.eod_id,
            "max_doc_tokens": self.max_doc_tokens,
            "long_docs": self.long_docs,
            # only when changed: outputs made before the option existed keep their fingerprint (and resume)
            **({"max_record_size": self.max_record_size} if self.max_record_size != DEFAULT_MAX_RECORD else {}),
        }


# The flag that sets each output-affecting setting, for the refusal of a rerun with other settings
FLAG_OF = {"tokenizer_sha256": "-t/--tokenizer", "text_field": "--text-field", "shard_size": "--shard-size",
           "append_eod": "--no-eod", "add_bos": "--bos", "eod_id": "--eod-id", "max_doc_tokens": "--max-doc-tokens",
           "long_docs": "--long-docs", "max_record_size": "--max-record-size", "curation": "--steps"}


def setting_changes(finished: dict, wanted: dict, tokenizers: tuple = ("", "")) -> List[str]:
    """The output-affecting settings in which ``wanted`` differs from a finished output's (its manifest's
    ``settings``), one phrase each naming the flag, e.g. "shard_size (--shard-size): 100000 -> 64000000". ``tokenizers``: the
    finished and the wanted tokenizer's paths, to name them beside their sha256. A curation fingerprint that differs
    with the same steps is a change of the inputs, not of the settings (a resume redoes those units)."""
    defaults = {"max_record_size": DEFAULT_MAX_RECORD}
    out = []
    for key in dict.fromkeys([*finished, *wanted]):
        if key in ("merged_from", "merge_target_bytes"):
            continue
        old, new = finished.get(key, defaults.get(key)), wanted.get(key, defaults.get(key))
        if key == "curation":
            old, new = (None if c is None else c.get("steps") for c in (old, new))
        if old == new:
            continue
        if key == "tokenizer_sha256":
            out.append(f"tokenizer (-t): {tokenizers[0] or '?'} (sha256 {str(old)[:12]}) -> {tokenizers[1] or '?'} "
                       f"(sha256 {str(new)[:12]})")
        else:
            out.append(f"{key} ({FLAG_OF.get(key, key)}): {old} -> {new}")
    return out


def fingerprint(d: dict) -> str:
    return hashlib.sha256(orjson.dumps(d, option=orjson.OPT_SORT_KEYS)).hexdigest()

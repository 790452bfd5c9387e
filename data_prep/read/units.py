"""Work units: the input listing cut into deterministic pieces of work.

A unit is a list of pieces (whole files, newline-aligned byte ranges of big uncompressed .jsonl files, or row ranges
of big parquet files, cut along their row groups, and of big saved datasets). The plan depends only on the sorted
input listing, the file sizes (parquet: row-group sizes; datasets: row counts) and the target size, so every worker
and every node computes the same plan, and unit ``i`` always writes shard ``shard_{i:06d}``.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

import orjson

from data_prep import io, objstore
from data_prep.read.formats import Piece, is_hf_dataset_dir, kind_of

log = logging.getLogger(__name__)

# A directory written by `data_prep curate` is read as its kept documents (shard_NNNNNN.jsonl) only: its manifest,
# markers, logs and dedup/ bookkeeping are not documents (read as such, every line of them would be a reject).
CURATION_MANIFEST = "curation.json"
CURATED_DOCS = re.compile(r"shard_\d{6}\.jsonl")
SPLITTABLE = ("jsonl",)  # uncompressed, one record per line: can be cut at any newline
ROW_KINDS = ("parquet", "hf")  # cut into row ranges (parquet: along its row groups)
PACKABLE = ("jsonl", "txt")  # small files of these kinds share a unit


class PlanError(Exception):
    pass


@dataclass
class Unit:
    index: int
    pieces: List[Piece] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"shard_{self.index:06d}"

    @property
    def nbytes(self) -> int:
        """Input bytes of the unit (row ranges: their share of the input's size), for progress and ETA."""
        total = 0
        for p in self.pieces:
            if p.kind in ROW_KINDS:
                rows = _num_rows(p.path, p.kind) if p.end >= 0 else 0  # a whole input needs no row count
                total += int(io.size(p.path) * ((p.end - p.start) / rows if rows else 1.0))
            else:
                end = p.end if p.end >= 0 else io.size(p.path)
                total += end - p.start
        return total

    def key(self) -> str:
        """Identity of the unit's input (paths, ranges, sizes, modification times): part of its completion check,
        so an input rewritten in place is redone on resume."""
        desc = [p.as_dict() | {"size": io.size(p.path), "mtime_ns": io.mtime_ns(p.path)} for p in self.pieces]
        return hashlib.sha256(orjson.dumps(desc)).hexdigest()


def list_inputs(specs: Sequence[str], output: str | None = None) -> List[Piece]:
    """Files, directories (recursive) and globs -> whole-input pieces, sorted by absolute path, de-duplicated.

    ``output``: the run's output directory. Its files (shards, manifest, plan, stats, reject logs) are never inputs:
    an input directory (or glob) that holds it is listed without it, said once; an input that is the output itself is
    refused (PlanError), since nothing of it would be left to read."""
    found = {}
    out = _own_output(specs, output)
    for spec in specs:
        spec = io.abspath(spec) if spec.startswith("file://") else spec
        if io.is_url(spec):
            found.update(_without_output(_list_remote(spec), spec, out))
            continue
        paths = sorted(glob.glob(spec, recursive=True)) if glob.has_magic(spec) else [spec]
        if not paths or not all(os.path.exists(p) for p in paths):
            raise PlanError(f"input not found: {spec!r} (give files, directories or quoted globs)")
        here: dict = {}
        for path in paths:
            path = os.path.abspath(path)
            if is_hf_dataset_dir(path):
                here[path] = "hf"
            elif os.path.isdir(path):
                for d, dirs, files in os.walk(path):
                    dirs[:] = sorted(x for x in dirs if not x.startswith(".")
                                     and not (out is not None and os.path.join(d, x) == out.path))
                    if is_hf_dataset_dir(d):
                        here[d] = "hf"
                        dirs[:] = []
                        continue
                    if _is_tokenize_output(d):  # shards and bookkeeping of another run, not documents
                        if d == path:
                            raise PlanError(f"input {path} is a `data_prep tokenize` output (shards and a manifest, "
                                            "not documents): give the inputs it was made from, or combine outputs "
                                            "with `data_prep merge` / `data_prep blend`")
                        log.info(f"data_prep: {d} is a `data_prep tokenize` output (shards, manifest): not read as "
                                 "input")
                        dirs[:] = []
                        continue
                    if os.path.exists(os.path.join(d, CURATION_MANIFEST)):  # `curate` output: its kept documents
                        files = [x for x in files if CURATED_DOCS.fullmatch(x)]
                        dirs[:] = []
                    for name in files:
                        kind = kind_of(name)
                        if kind and not name.startswith("."):
                            here[os.path.join(d, name)] = kind
            else:
                kind = kind_of(path)
                if kind is None:
                    raise PlanError(
                        f"{path}: unknown input type; expected .jsonl/.json (optionally .gz/.zst), .parquet, .txt "
                        "or a directory written by datasets' save_to_disk"
                    )
                here[path] = kind
        found.update(_without_output(here, spec, out))
    if out is not None and out.holder:
        log.info(f"data_prep: the output {out.path} is inside the input {out.holder}: its files (shards, manifest, "
                 "logs) are not read as input")
    if not found:
        raise PlanError(f"no readable inputs under {list(specs)} (.jsonl/.json[.gz|.zst], .parquet, .txt, HF dataset)")
    return [Piece(path, kind) for path, kind in sorted(found.items())]


def _is_tokenize_output(d: str) -> bool:
    """Whether directory ``d`` was written by `data_prep tokenize` (its plan.json or a megatron-mmidx manifest): its
    .json/.jsonl files are a run's bookkeeping, never documents."""
    for name, key, value in (("plan.json", "fingerprint", None), ("manifest.json", "format", "megatron-mmidx")):
        path = os.path.join(d, name)
        if not os.path.isfile(path) or os.path.getsize(path) > 1 << 26:
            continue
        try:
            with open(path, "rb") as f:
                doc = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(doc, dict) and key in doc and (value is None or doc[key] == value):
            return True
    return False


@dataclass
class _Output:
    """The run's output directory while the inputs are listed: its path (absolute, or a URL without a trailing slash)
    and the first input that holds it (its files are then left out of that input's listing)."""
    path: str
    holder: str = ""

    def holds(self, path: str) -> bool:
        return path == self.path or path.startswith(self.path + "/")


def _base_of(spec: str) -> str:
    """The directory or file an input names, without a glob's magic part: what decides whether it is inside the
    output. Local paths absolute, URLs without a trailing slash."""
    if glob.has_magic(spec):
        head = []
        for part in spec.split("/"):
            if glob.has_magic(part):
                break
            head.append(part)
        spec = "/".join(head) or "/"
    return spec.rstrip("/") if io.is_url(spec) else os.path.abspath(spec)


def _own_output(specs: Sequence[str], output: str | None) -> _Output | None:
    """The output as a listing filter; refuses an input that is the output itself (PlanError naming both)."""
    if not output:
        return None
    out = _Output(io.abspath(output).rstrip("/") if io.is_url(io.abspath(output)) else io.abspath(output))
    for spec in specs:
        spec = io.abspath(spec) if spec.startswith("file://") else spec
        base = _base_of(spec)
        if base == out.path:
            raise PlanError(f"input {spec} is the output directory -o {output}: a rerun would read the run's own "
                            "shards, manifest and logs as input; write to a directory outside the input (e.g. "
                            f"-o {out.path}-shards, or -o {out.path}/shards for an input directory)")
        if not out.holder and out.path.startswith(base.rstrip("/") + "/"):
            out.holder = spec
    return out


def _without_output(found: dict, spec: str, out: _Output | None) -> dict:
    """``found`` without the output's own files, unless the input names a place inside the output (an input that the
    user keeps in the output directory on purpose, e.g. -o OUT with OUT/raw/)."""
    if out is None or out.holds(_base_of(spec)):
        return found
    return {path: kind for path, kind in found.items() if not out.holds(path)}


def _list_remote(spec: str) -> dict:
    """URL -> kind for an object, a prefix (every object under it, one paged listing) or a glob of objects."""
    if glob.has_magic(spec):
        urls = objstore.glob(spec)
    elif not spec.endswith("/") and objstore.info(spec) is not None:  # "prefix/": no HEAD, a listing
        urls = [spec]
    else:
        urls = objstore.list_tree(spec)
    if not urls:
        raise PlanError(f"input not found: {spec!r} (no object at or under it; check the URL and the endpoint)")
    found = {}
    for url in urls:
        name = objstore.basename(url)
        if name in ("dataset_info.json", "dataset_dict.json", "state.json"):
            raise PlanError(f"{url}: a dataset written by save_to_disk is read from a local directory only; copy it "
                            "locally or export it as parquet/jsonl")
        kind = kind_of(name)
        if kind and not name.startswith(".") and not any(part.startswith(".") for part in url.split("/")[3:]):
            found[url] = kind
        elif url == spec:
            raise PlanError(f"{url}: unknown input type; expected .jsonl/.json (optionally .gz/.zst), .parquet or "
                            ".txt")
    return found


def _next_line_start(path: str, offset: int, size: int) -> int:
    """The first byte after the first newline at or after ``offset`` (or the file size). On object storage: small
    ranged GETs from ``offset``, a little past the boundary, not a read of the object."""
    with io.open_read(path, block_size=objstore.PROBE_BLOCK) as f:
        f.seek(offset)
        while True:
            block = f.read(1 << 16)
            if not block:
                return size
            nl = block.find(b"\n")
            if nl >= 0:
                return min(offset + nl + 1, size)
            offset += len(block)


def split_ranges(path: str, target_bytes: int) -> List[Piece]:
    """Newline-aligned byte ranges of about ``target_bytes`` covering a .jsonl file."""
    size = io.size(path)
    pieces, start = [], 0
    while start < size:
        end = size if size - start <= target_bytes else _next_line_start(path, start + target_bytes - 1, size)
        pieces.append(Piece(path, "jsonl", start, end))
        start = end
    return pieces or [Piece(path, "jsonl", 0, 0)]


@functools.lru_cache(maxsize=None)
def _parquet_row_groups(path: str) -> Tuple[Tuple[int, int], ...]:
    """(rows, compressed bytes) of each row group; () when the footer cannot be read (the reader reports it)."""
    import pyarrow.parquet as pq

    try:
        with io.open_read(path, block_size=objstore.PROBE_BLOCK) as f:  # the footer only: ranged GETs at the end
            md = pq.ParquetFile(f).metadata
    except Exception:
        return ()
    return tuple((md.row_group(i).num_rows,
                  sum(md.row_group(i).column(c).total_compressed_size for c in range(md.num_columns)))
                 for i in range(md.num_row_groups))


@functools.lru_cache(maxsize=None)
def _num_rows(path: str, kind: str) -> int:
    if kind == "parquet":
        return sum(rows for rows, _ in _parquet_row_groups(path))
    from data_prep.read.formats import open_hf_dataset

    try:
        return len(open_hf_dataset(path))
    except Exception:
        return 0


def _row_ranges(path: str, kind: str, target_bytes: int) -> List[Piece]:
    """Row ranges of about ``target_bytes`` of input each: parquet cut at row-group boundaries (a row group is read
    whole), a saved dataset at any row. One whole-input piece when it does not split."""
    if kind == "hf":
        n = _num_rows(path, kind)
        step = max(1, int(target_bytes * n / max(io.size(path), 1)))
        if n <= step:
            return [Piece(path, kind)]
        return [Piece(path, kind, lo, min(lo + step, n)) for lo in range(0, n, step)]
    pieces, start, row, acc = [], 0, 0, 0.0
    groups = _parquet_row_groups(path)
    for rows, nbytes in groups:
        if acc and acc + nbytes > target_bytes:
            pieces.append(Piece(path, kind, start, row))
            start, acc = row, 0.0
        row += rows
        acc += nbytes
    if len(pieces) == 0:
        return [Piece(path, kind)]
    return pieces + [Piece(path, kind, start, row)]


def plan_units(pieces: Sequence[Piece], target_bytes: int) -> List[Unit]:
    if target_bytes <= 0:
        raise PlanError("--shard-size must be positive")
    units: List[Unit] = []
    open_unit, open_bytes = None, 0

    def close():
        nonlocal open_unit, open_bytes
        if open_unit is not None:
            units.append(open_unit)
        open_unit, open_bytes = None, 0

    for piece in pieces:
        size = io.size(piece.path)
        if piece.kind in SPLITTABLE and size > target_bytes:
            close()
            for part in split_ranges(piece.path, target_bytes):
                units.append(Unit(len(units), [part]))
        elif piece.kind in ROW_KINDS and size > target_bytes:
            close()
            for part in _row_ranges(piece.path, piece.kind, target_bytes):
                units.append(Unit(len(units), [part]))
        elif piece.kind in PACKABLE:
            if open_unit is not None and open_bytes + size > target_bytes:
                close()
            if open_unit is None:
                open_unit = Unit(len(units), [])
            open_unit.pieces.append(piece)
            open_bytes += size
        else:  # compressed, parquet, datasets: a unit of their own, so a broken one fails alone
            close()
            units.append(Unit(len(units), [piece]))
    close()
    return units

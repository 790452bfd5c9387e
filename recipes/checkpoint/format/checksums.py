"""Per-file checksums of a checkpoint: computed while each file is written, checked whenever one is read.

Bit rot on a shared file system (a block zeroed, same size) passes a size check: complete.json's sizes vouched for
a damaged file, and export wrote 4,096 zero weights with exit 0. So every file a save writes through
`recipes.checkpoint.writer.write_durably` is hashed as its bytes go out (xxh3-64: ~10 GB/s, well under the disk's
cost), and each writer leaves `checksums_<who>.json` (file name -> hex digest) in the tag; `verify` checks a file
against it before the file is loaded. The data-only loader calls it for every torch.load of the project
(recipes.checkpoint.safe_load): resume, export-hf, reshape, init_from, evaluate and the state reader all check what
they read, each file once per process. A mismatch raises ChecksumError naming the file; a file with no recorded
checksum (a checkpoint from before the records, a file a library wrote itself) is read as before.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import xxhash

from recipes.checkpoint.format.errors import CheckpointError

PREFIX, SUFFIX = "checksums_", ".json"
_CHUNK = 8 << 20


class ChecksumError(CheckpointError):
    """A checkpoint file whose content is not what was written."""


class Hashing:
    """A writable file that hashes what goes through it (the write side of `digest`)."""

    def __init__(self, f):
        self.f, self.h = f, xxhash.xxh3_64()

    def write(self, data) -> int:
        self.h.update(data)
        return self.f.write(data)

    def hexdigest(self) -> str:
        return self.h.hexdigest()

    def __getattr__(self, name):  # flush, fileno, tell: the file's own (torch.save writes sequentially)
        return getattr(self.f, name)


def digest(path: str | Path) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def record(tag_dir: str | Path, who: str, digests: dict[str, str]) -> None:
    """Write `checksums_<who>.json` (file names relative to the tag -> digests), atomically and fsynced."""
    if not digests:
        return
    from data_prep.io import atomic_write

    tag_dir = Path(tag_dir)
    names = {str(Path(p).resolve().relative_to(tag_dir.resolve())): d for p, d in digests.items()}
    atomic_write(str(tag_dir / f"{PREFIX}{who}{SUFFIX}"), json.dumps(names, indent=0, sort_keys=True))


_RECORDS: dict[str, tuple[tuple, dict]] = {}  # tag dir -> (the record files' identity, name -> digest)
_VERIFIED: set[tuple] = set()  # (path, size, mtime_ns) already checked in this process


def _records(tag_dir: Path) -> dict[str, str]:
    files = sorted(tag_dir.glob(f"{PREFIX}*{SUFFIX}"))
    key = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    cached = _RECORDS.get(str(tag_dir))
    if cached and cached[0] == key:
        return cached[1]
    merged: dict[str, str] = {}
    for p in files:
        try:
            merged.update(json.loads(p.read_text()))
        except (OSError, ValueError) as e:
            raise ChecksumError(f"{p}: the checksum record is unreadable ({e}); the tag is damaged: use another tag "
                                "(--tag, or move this one aside)") from None
    _RECORDS[str(tag_dir)] = (key, merged)
    return merged


def verify(path: str | Path) -> None:
    """Check one file against its tag's records (once per process); ChecksumError naming it on a mismatch."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return  # the loader reports what is missing
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        return
    want = _records(path.resolve().parent).get(path.name)
    if want is not None:
        got = digest(path)
        if got != want:
            raise ChecksumError(f"{path}: its content is not what was written (xxh3 {got}, recorded {want} in "
                                f"{path.parent}/{PREFIX}*{SUFFIX}): the file is damaged (a disk or copy error); "
                                "restore it from a copy, or resume / export another tag (--tag, or move this one "
                                "aside)")
    _VERIFIED.add(key)


def forget() -> None:
    """Check every file again at its next read (what this process checked and the records it read are forgotten)."""
    _VERIFIED.clear()
    _RECORDS.clear()


def who_am_i() -> str:
    """The writer's name in its record: the rank (RANK), else the process."""
    rank = os.environ.get("RANK")
    return f"rank{rank}" if rank is not None else f"pid{os.getpid()}"

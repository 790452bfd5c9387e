"""The dataset index cache: keyed on the shards' content, every file checked before megatron-core opens it.

megatron-core reads its index cache with ``numpy.load(allow_pickle=True)``, and numpy falls back to ``pickle.load``
for a file without the ``.npy`` magic (``mmap_mode`` or not): a file planted in the cache directory (a checkpoint
directory copied from elsewhere, a shared cache) would run code in every rank. So:
- ``verify_cache`` reads each cache file's header the safe way (numpy's header parser, a literal, never pickle) and
  checks a real ``.npy`` with an integer dtype, the shape its name implies and a size that matches; a bad file is
  removed with its group (so megatron-core rebuilds the set) and named in the log;
- ``no_pickle_loads`` makes megatron-core's dataset modules load with ``allow_pickle=False`` (a file replaced after the
  check raises instead of running); ``pickle_refusal`` turns that refusal into one line naming the file;
- ``cache_subdir`` keys the directory on the shards' identity (the manifest's sha256 of each .idx/.bin where known,
  and each file's size and mtime), so regenerated shards at the same prefix get fresh indices instead of stale ones.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import types
from pathlib import Path
from typing import Iterable, Optional

import numpy

log = logging.getLogger(__name__)

# megatron-core's cache files: "<md5>-<Class>-<split>-<what>.npy" -> the number of dimensions of <what>.
_NDIM = {"document_index": 1, "sample_index": 2, "shuffle_index": 1, "dataset_index": 1, "dataset_sample_index": 1}
_NAME = re.compile(r"^(?P<group>.+-(?:train|valid|test))-(?P<what>[a-z_]+)\.npy$")


def check_npy(path: Path, ndim: Optional[int] = None) -> Optional[str]:
    """None when ``path`` is a plain .npy array of integers with the shape its name implies (or ``ndim``
    dimensions), else why not."""
    m = _NAME.match(path.name)
    what = m.group("what") if m else None
    if ndim is None and what not in _NDIM:
        return "not a file megatron-core writes to its index cache"
    ndim = _NDIM[what] if ndim is None else ndim
    try:
        with open(path, "rb") as f:
            try:
                version = numpy.lib.format.read_magic(f)
            except ValueError:
                return "not a .npy file (no numpy header; numpy would unpickle it)"
            read = {(1, 0): numpy.lib.format.read_array_header_1_0,
                    (2, 0): numpy.lib.format.read_array_header_2_0}.get(version)
            if read is None:
                return f"unsupported .npy version {version}"
            shape, _, dtype = read(f)  # a Python literal, parsed with ast.literal_eval: never code
            offset = f.tell()
    except (OSError, ValueError) as e:
        return f"unreadable header ({e})"
    if dtype.hasobject or dtype.kind not in "iu":
        return f"dtype {dtype} is not an integer index"
    if len(shape) != ndim or (what == "sample_index" and shape[1] != 2):
        return f"shape {shape} is not the shape of a {what or 'one-dimensional index'}"
    want = offset + int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
    size = path.stat().st_size
    if size != want:
        return f"{size} bytes where its header says {want} (truncated or padded)"
    return None


def verify_cache(cache_dir: Path, repair: bool) -> list[tuple[Path, str]]:
    """Check every .npy file of ``cache_dir``; returns the bad ones with why. With ``repair`` (the rank that builds),
    each bad file's whole group (the indices of one dataset split, and its description) is removed, so megatron-core
    rebuilds it consistently; the others only look."""
    bad = []
    for path in sorted(cache_dir.glob("*.npy")) if cache_dir.is_dir() else ():
        why = check_npy(path)
        if why is None:
            continue
        bad.append((path, why))
        if repair:
            log.warning(f"data cache: {path}: {why}; removed with its group, rebuilding")
            m = _NAME.match(path.name)
            group = m.group("group") if m else path.stem
            for p in list(cache_dir.glob(glob_escape(group) + "-*")) + [path]:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
    return bad


def glob_escape(s: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", s)


def shard_identity(prefixes: Iterable[str], recorded: Optional[dict] = None) -> str:
    """A hash of what the indices are computed from: per prefix, the .idx/.bin sha256 the manifest recorded (when
    known) and each file's size and modification time (a shard rewritten in place changes them)."""
    h = hashlib.sha256()
    recorded = recorded or {}
    for p in prefixes:
        h.update(p.encode() + b"\0" + repr(recorded.get(p)).encode())
        for suffix in (".idx", ".bin"):
            st = os.stat(p + suffix)
            h.update(f"{suffix}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def cache_subdir(cache_dir: str, identity: str) -> Path:
    """The directory of this set of shards' indices (one per content identity)."""
    return Path(cache_dir) / f"shards-{identity[:20]}"


class _NoPickleNumpy(types.ModuleType):
    """numpy as megatron-core's dataset modules see it, except that ``load`` never unpickles."""

    def __getattr__(self, name):
        return getattr(numpy, name)

    @staticmethod
    def load(file, *args, **kwargs):
        kwargs["allow_pickle"] = False
        return numpy.load(file, *args, **kwargs)


def no_pickle_loads() -> None:
    """Make megatron-core's GPT and blended datasets read their index cache with allow_pickle=False (idempotent)."""
    from megatron.core.datasets import blended_dataset, gpt_dataset

    for mod in (gpt_dataset, blended_dataset):
        if not isinstance(mod.numpy, _NoPickleNumpy):
            mod.numpy = _NoPickleNumpy("numpy")


def pickle_refusal(err: BaseException, cache_dir: Path) -> Optional[str]:
    """The line to stop with when megatron-core met a pickled cache file (replaced after the check), else None."""
    if "pickled" not in str(err):
        return None
    bad = [f"{p} ({why})" for p, why in verify_cache(cache_dir, repair=False)]
    where = ", ".join(bad) or str(cache_dir)
    return f"data cache: {where} holds pickled data, refused; delete it (or the directory) and rerun"

"""The task, group and tag names lm-eval ships, kept in a small JSON cache per installed task tree.

`recipes evaluate --include-path DIR` must refuse a folder task that takes a name lm-eval ships (lm-eval would let the
folder's code run under it). Knowing those names means indexing lm-eval's ~14,000 task YAMLs: ~9-13 s of CPU on every
call. The names only change when lm-eval's task files do, so they are cached under `$XDG_CACHE_HOME/recipes` (default
~/.cache/recipes), keyed by the path, size and mtime of every YAML file there (~0.15 s of CPU to check). A missing,
unreadable or stale cache is rebuilt; nothing in it is executed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recipes"


def tree_key(tasks_dir: Path) -> str:
    """A digest of every YAML file under `tasks_dir`: relative path, size, mtime (what an upgrade or an edit moves)."""
    root = str(tasks_dir.resolve())
    lines, folders = [], [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    folders.append(e.path)
                elif e.name.endswith(".yaml"):
                    st = e.stat()
                    lines.append(f"{e.path[len(root):]}\0{st.st_size}\0{st.st_mtime_ns}\n")
    return hashlib.sha256("".join([root, "\n", *sorted(lines)]).encode()).hexdigest()


def _cache_file(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"lm_eval_names-{key[:32]}.json"


def cached_names(tasks_dir: Path, cache_dir: Path | None = None, key: str | None = None) -> set[str] | None:
    """The cached names of `tasks_dir`'s index, or None when there is no valid cache for its current files."""
    key = key or tree_key(tasks_dir)
    path = _cache_file(cache_dir or default_cache_dir(), key)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("names"), list):
        return None
    return set(map(str, data["names"]))


def store_names(tasks_dir: Path, names: set[str], cache_dir: Path | None = None, key: str | None = None) -> None:
    """Write the cache atomically (a reader sees the old file or the whole new one); a cache that cannot be written
    costs the next call its index, nothing else."""
    key = key or tree_key(tasks_dir)
    cache_dir = cache_dir or default_cache_dir()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".lm_eval_names-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "tasks_dir": str(tasks_dir), "names": sorted(names)}, f)
        os.replace(tmp, _cache_file(cache_dir, key))
    except OSError as e:
        log.debug("lm-eval name cache not written (%s)", e)


def builtin_names(tasks_dir: Path, cache_dir: Path | None = None) -> set[str]:
    """Every name lm-eval's own index of `tasks_dir` holds: from the cache, else indexed (and cached)."""
    key = tree_key(tasks_dir)
    names = cached_names(tasks_dir, cache_dir, key)
    if names is None:
        from lm_eval.tasks import TaskManager

        names = set(TaskManager(include_path=str(tasks_dir), include_defaults=False).task_index)
        store_names(tasks_dir, names, cache_dir, key)
    return names

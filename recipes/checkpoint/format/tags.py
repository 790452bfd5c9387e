"""The tags of a checkpoint directory: names, completion markers, DeepSpeed's `latest` pointer, pruning.

  <dir>/global_step<N>/...             DeepSpeed model / optimizer / scheduler / loss-scale states
  <dir>/global_step<N>/rng_rank<R>.pt  each rank's RNG states (recipes.checkpoint.format.rng)
  <dir>/global_step<N>/complete.json   written by rank 0 only after every rank's files are durable: step, client
                                       state, files and sizes
  <dir>/latest                         DeepSpeed's pointer (users' habit), written after complete.json; readers still
                                       check the marker (a damaged newest tag is skipped)

A tag name reaches a path (`--tag`, the `latest` file): only names of letters, digits, '.', '_' and '-' without '..'
are accepted, so neither can point outside the checkpoint directory.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

from data_prep.io import atomic_write
from recipes.checkpoint.format.errors import CheckpointError

log = logging.getLogger(__name__)
MARKER = "complete.json"
LATEST = "latest"
_STEP_TAG = re.compile(r"^global_step(\d+)$")
_TAG_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")


def tag_for(step: int) -> str:
    return f"global_step{step}"


def step_of(tag: str) -> int | None:
    """N of a global_step<N> tag (None for another name)."""
    m = _STEP_TAG.match(tag)
    return int(m.group(1)) if m else None


def check_tag_name(tag: str, source: str) -> str:
    """`tag` if it is a plain tag name; a CheckpointError naming `source` (where it came from) otherwise."""
    if not _TAG_NAME.match(tag) or ".." in tag:
        raise CheckpointError(f"{source}: {tag!r} is not a checkpoint tag name (letters, digits, '.', '_' and '-', "
                              "e.g. global_step123; no '/' or '..'); name a tag directory inside the checkpoint "
                              "directory")
    return tag


def tags(root: Path) -> list[tuple[int, str]]:
    """(step, tag) of every global_step<N> directory, newest first."""
    if not root.is_dir():
        return []
    out = [(int(m.group(1)), p.name) for p in root.iterdir() if p.is_dir() and (m := _STEP_TAG.match(p.name))]
    return sorted(out, reverse=True)


def problems(tag_dir: Path) -> list[str]:
    """Why a tag cannot be loaded ([] if it is complete)."""
    marker = tag_dir / MARKER
    if not marker.is_file():
        return [f"no {MARKER} (the save was interrupted)"]
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError) as e:
        return [f"unreadable {MARKER}: {e}"]
    out = []
    for name, size in files.items():
        p = tag_dir / name
        if not p.is_file():
            out.append(f"missing {name}")
        elif p.stat().st_size != size:
            out.append(f"{name} has {p.stat().st_size} bytes, expected {size}")
    return out


def newest_complete(ckpt_dir: str) -> str | None:
    """The newest loadable tag, saying which newer ones were skipped and why."""
    root = Path(ckpt_dir)
    for _, tag in tags(root):
        bad = problems(root / tag)
        if not bad:
            return tag
        log.warning(f"checkpoint: skipping {root / tag}: {'; '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}; "
                    "falling back to an older checkpoint")
    return None


def client_state(tag_dir: Path) -> dict:
    """The client state (step, consumed samples, ...) complete.json recorded for a tag."""
    return json.loads((tag_dir / MARKER).read_text()).get("client_state", {})


def mark_complete(root: Path, tag: str, step: int, client_state: dict, keep_last: int) -> dict:
    """After every file of `tag` is durable: complete.json (files and sizes), then `latest`, then prune old tags.
    Returns the files and their sizes."""
    files = {str(p.relative_to(root / tag)): p.stat().st_size
             for p in sorted((root / tag).rglob("*")) if p.is_file() and p.name != MARKER}
    marker = {"step": step, "client_state": client_state, "files": files}
    atomic_write(str(root / tag / MARKER), json.dumps(marker, indent=1))
    atomic_write(str(root / LATEST), tag)
    prune(root, keep_last, step)
    log.info(f"checkpoint: saved {root / tag} ({len(files)} files)")
    return files


def prune(root: Path, keep_last: int, completed_step: int) -> None:
    """Keep the newest `keep_last` complete tags, and remove the incomplete tags older than the one just completed
    (`completed_step`): interrupted saves, full-size and never loaded. At most one save is in flight and it is the one
    just completed, so an older incomplete tag is never being written; newer ones are left alone (a resume from an
    older tag re-saves them)."""
    found = tags(root)
    complete = [t for _, t in found if (root / t / MARKER).is_file()]
    for t in complete[keep_last:]:
        shutil.rmtree(root / t, ignore_errors=True)
        log.info(f"checkpoint: removed old {root / t} (keep_last={keep_last})")
    for s, t in found:
        if s < completed_step and not (root / t / MARKER).is_file():
            shutil.rmtree(root / t, ignore_errors=True)
            log.info(f"checkpoint: removed {root / t}, an interrupted save older than {tag_for(completed_step)}")


def resolve_tag(ckpt_dir: str | Path, tag: str | None = None) -> Path:
    """The tag directory to read: `tag` (--tag), else DeepSpeed's `latest` pointer; checked to be a plain tag name
    and complete (complete.json sizes)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise CheckpointError(f"{root}: no such checkpoint directory")
    if tag is None:
        latest = root / LATEST
        if not latest.is_file():
            raise CheckpointError(f"{root}: no `latest` file naming the checkpoint tag{_tags_hint(root)}")
        tag = check_tag_name(latest.read_text().strip(), str(latest))
    else:
        check_tag_name(tag, "--tag")
    tag_dir = root / tag
    if not tag_dir.is_dir():
        raise CheckpointError(f"{tag_dir}: tag directory missing (named by {root / LATEST} or --tag)")
    bad = problems(tag_dir)
    if bad:
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        raise CheckpointError(f"{tag_dir} is incomplete or damaged: {'; '.join(bad[:3])}{more}; "
                              "use an older tag with --tag or re-save it")
    return tag_dir


def _tags_hint(root: Path) -> str:
    found = [t for _, t in tags(root)]
    newest = newest_complete(str(root))
    if newest:
        return f"; tags found: {', '.join(found)}; pass --tag {newest} (the newest complete one)"
    if found:
        return f"; tags found: {', '.join(found)}, none complete (no complete.json): the saves were interrupted"
    return "; no global_step* tags either: is this a training checkpoint directory (checkpoint.dir)?"

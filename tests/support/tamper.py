"""Changing a saved checkpoint the way the tests' adversaries do: an attacker who can write the checkpoint directory
(a payload in a file, its size and checksum records rewritten so the tag still looks whole), and a disk that damages
a file (bytes changed in place, the size and records left as they were)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from recipes.checkpoint import safe_load
from recipes.checkpoint.format import checksums


def plant(tag_dir: Path, name: str, payload) -> None:
    """Add `payload` to file `name` of the tag and make complete.json and the checksum records vouch for it."""
    f = tag_dir / name
    state = safe_load.load(f, legacy_rng=True)
    state["extra"] = payload
    torch.save(state, f)
    rewritten = [f]
    for record in tag_dir.glob(f"{checksums.PREFIX}*{checksums.SUFFIX}"):
        names = json.loads(record.read_text())
        if name in names:
            names[name] = checksums.digest(f)
            record.write_text(json.dumps(names))
            rewritten.append(record)
    complete = tag_dir / "complete.json"
    meta = json.loads(complete.read_text())
    for p in rewritten:
        meta["files"][p.name] = p.stat().st_size
    complete.write_text(json.dumps(meta))


def damage(f: Path, offset: int = 16 << 10, length: int = 16 << 10) -> None:
    """Zero `length` bytes of `f` from `offset` (or from its middle if it is shorter), in place: same size, same
    name, as a bad block or a torn copy leaves it."""
    size = f.stat().st_size
    if offset + length > size:
        offset, length = size // 4, max(1, size // 2)
    with open(f, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(length)
        fh.seek(offset)
        fh.write(bytes(length) if any(old) else b"\xff" * length)

"""A split that must give samples but gets no document: megatron-core's GPTDataset then never returns (it counts the
epochs a split needs by adding the split's tokens until they reach the samples asked for, and zero tokens never do).
Training always asks the train split and, for its validation batches, the validation split. A corpus of 16 documents
at data.split=98,2,0 gives the validation split round(0.98 x 16) .. round(1.0 x 16) = no document: said here, before
any rank starts, with the smallest fix."""
from __future__ import annotations

import json
from pathlib import Path

import re

SPLITS = ("train", "validation")


def split_weights(split: str) -> list[float]:
    """megatron-core's parse_and_normalize_split, without importing megatron-core (the planner and the launcher stay
    light; a unit test pins the two together): "98,2,0" or "98/2/0", padded to three, summing to 1."""
    weights = [float(x) for x in re.split(r"[,/]", split)]
    weights += [0.0] * (3 - len(weights))
    return [w / sum(weights) for w in weights]


def documents_per_split(split: str, documents: int) -> list[int]:
    """The documents megatron-core gives the train and validation splits of a dataset of `documents` documents: its
    split matrix (cumulative bounds; a zero weight is no split) and its rounding."""
    weights, out, lo = split_weights(split), [], 0.0
    for w in weights[:len(SPLITS)]:
        hi = lo + w
        out.append(0 if w == 0 else int(round(hi * documents)) - int(round(lo * documents)))
        lo = hi
    return out


def manifest_documents(path: Path) -> int | None:
    """The documents a data_prep manifest holds (None for a blend output or an unreadable file: checked elsewhere)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("sources") or not isinstance(data.get("shards"), list):
        return None
    return sum(int(s.get("documents", 0)) for s in data["shards"] if isinstance(s, dict))


def empty_split_message(field: str, path: Path, split: str, documents: int) -> tuple[str, str] | None:
    """(message, fix) when the train or validation split of this manifest gets no document, else None."""
    counts = documents_per_split(split, documents)
    empty = [name for name, n in zip(SPLITS, counts) if n == 0]
    if not empty:
        return None
    need = 1
    while 0 in documents_per_split(_share(split, need, documents), documents) and need < documents:
        need += 1
    return (f"data.split = {split}: the {' and '.join(empty)} split of {field} ({path}, {documents} documents) gets "
            f"no document, and megatron-core's dataset never returns for an empty split it must sample",
            f"give it a larger share, e.g. data.split={_share(split, need, documents)}, or tokenize more documents")


def _share(split: str, docs_for_validation: int, documents: int) -> str:
    """A split with the validation share raised to about `docs_for_validation` documents (train keeps the rest)."""
    weights = split_weights(split)
    valid = max(weights[1], (docs_for_validation + 0.5) / documents)
    test = weights[2] if len(weights) > 2 else 0.0
    train = max(0.0, 1.0 - valid - test)
    return ",".join(f"{round(100 * w)}" for w in (train, valid, test))

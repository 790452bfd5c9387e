"""The hash pass's quality verdicts, carried to the filter pass so the quality rules run once per document.

The hash pass evaluates every ``quality`` step that comes before the last dedup step (it must, to know which
documents reach the dedup steps); it stores each step's verdict per record ordinal of the unit, one byte each
(0 = kept, k = the k-th rule of ``RULES`` failed, ``NOT_EVALUATED`` = never reached: rejected, or removed by an
earlier quality step), in ``dedup/<step>.verdicts_NNNNNN.npy``. The unit's hash marker, itself tied to the run's
fingerprint (settings, step list, every unit's input key), records each file's record count, SHA-256 and the rules'
version. The filter pass uses a file only when all of these match; otherwise it logs why and evaluates the rules
itself (the same verdicts, at the old cost), so a stale, truncated or foreign file is never used.
"""

from __future__ import annotations

import hashlib
import io as pyio
from typing import Dict, Optional, Tuple

import numpy as np

from data_prep.steps.filters import RULES, QualityFilter

# Bump when a rule's definition changes: verdict files written before are then recomputed, not trusted.
RULES_VERSION = 2  # 2: Gopher's bullet, ellipsis and paragraph rules added
NOT_EVALUATED = 255
_CODE = {r: i + 1 for i, r in enumerate(RULES)}
_REASON = {i + 1: r for i, r in enumerate(RULES)}


def code(reason: Optional[str]) -> int:
    return 0 if reason is None else _CODE[reason]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def marker_entry(file_name: str, codes: np.ndarray, data: bytes) -> Dict:
    """What the hash marker records of one step's verdict file (``data``: the file's bytes)."""
    return {"file": file_name, "records": int(len(codes)), "sha256": digest(data), "rules": RULES_VERSION}


def load(path: str, entry: Optional[Dict], dtype=np.uint8) -> Tuple[Optional[np.ndarray], str]:
    """The verdict codes of ``path`` when they match the marker's ``entry``; else (None, why not)."""
    if not entry:
        return None, "the hash marker lists no verdicts for this step (written by an older version?)"
    if entry.get("rules") != RULES_VERSION:
        return None, f"verdicts of rules version {entry.get('rules')}, this code is version {RULES_VERSION}"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror}"
    if digest(data) != entry.get("sha256"):
        return None, f"{path} does not match its hash marker's SHA-256 (changed or truncated)"
    codes = np.load(pyio.BytesIO(data), allow_pickle=False)
    if codes.dtype != dtype or codes.ndim != 1 or len(codes) != entry.get("records"):
        return None, f"{path}: not {entry.get('records')} verdicts of {np.dtype(dtype).name}"
    return codes, ""


class CarriedQuality:
    """A quality step's decision in the filter pass: the hash pass's stored verdict when there is one, the rules
    evaluated here otherwise. ``check(text, ordinal)`` -> None or the failed rule's name, as QualityFilter.check."""

    def __init__(self, qf: QualityFilter, codes: Optional[np.ndarray]):
        self.qf, self.codes = qf, codes
        self.live = 0  # documents evaluated here (none when every verdict was carried)

    def check(self, text: str, ordinal: int) -> Optional[str]:
        if self.codes is not None and ordinal < len(self.codes):
            c = int(self.codes[ordinal])
            if c != NOT_EVALUATED:
                return _REASON.get(c)
        self.live += 1
        return self.qf.check(text)

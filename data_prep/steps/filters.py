"""Heuristic quality filters (Gopher / C4 style): one document in, the name of the first rule it fails out (or None).

The rules and their default thresholds follow Gopher (Rae et al. 2021, appendix A: "quality filters" and "repetition
removal") as datatrove's GopherQualityFilter / GopherRepetitionFilter implement them, plus C4's "lines end in terminal
punctuation" (as a document-level fraction, datatrove's FineWeb filter's 0.12) and a digit-share rule. datatrove
itself is not a dependency (it pulls a whole pipeline framework); these are a few lines each.

Words are whitespace-separated tokens: language-agnostic and what the thresholds were tuned on (Gopher counts words
the same way). Every threshold is a field of ``QualityConfig``; ``null`` in the YAML turns that rule off.
"""

from __future__ import annotations

import re
from itertools import compress
from operator import not_
from typing import Dict, List, Literal, Optional, Tuple

import numpy as np

from pydantic import BaseModel, ConfigDict, Field, field_validator


GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
TERMINAL_PUNCTUATION = (".", "!", "?", '"', "'", "\u201d", "\u2019", ":", ";", ")", "\u3002", "\uff01", "\uff1f")
# Gopher: the most frequent n-gram may cover at most this share of the characters (n = 2, 3, 4) ...
TOP_NGRAMS = {2: 0.20, 3: 0.18, 4: 0.16}
# ... and n-grams that occur more than once at most this share (n = 5..10).
DUP_NGRAMS = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}


class QualityConfig(BaseModel):
    """Thresholds of the ``quality`` step; the reason a document is removed is the field's rule name."""

    model_config = ConfigDict(extra="forbid")

    min_words: Optional[int] = Field(50, ge=0, description="fewer whitespace words: removed (doc_words)")
    max_words: Optional[int] = Field(100_000, ge=1, description="more words: removed (doc_words)")
    min_mean_word_length: Optional[float] = Field(3.0, ge=0, description="mean characters per word below: removed")
    max_mean_word_length: Optional[float] = Field(10.0, ge=0, description="mean characters per word above: removed")
    max_symbol_word_ratio: Optional[float] = Field(0.1, ge=0, description="('#' + '...' + '\u2026') / words above")
    max_digit_fraction: Optional[float] = Field(0.3, ge=0, le=1, description="digits / non-space characters above")
    min_alpha_word_fraction: Optional[float] = Field(0.8, ge=0, le=1,
                                                     description="share of words with a letter below")
    min_stop_words: Optional[int] = Field(2, ge=0, description="fewer distinct Gopher stop words present")
    stop_words: List[str] = Field(default_factory=lambda: list(GOPHER_STOP_WORDS))
    max_duplicate_line_fraction: Optional[float] = Field(0.3, ge=0, le=1,
                                                         description="share of non-empty lines that repeat above")
    min_punctuation_line_fraction: Optional[float] = Field(0.12, ge=0, le=1,
                                                           description="share of lines ending in . ! ? etc. below")
    top_ngram_char_fraction: Optional[Dict[int, float]] = Field(default_factory=lambda: dict(TOP_NGRAMS))
    dup_ngram_char_fraction: Optional[Dict[int, float]] = Field(default_factory=lambda: dict(DUP_NGRAMS))
    # Gopher's other rules (published.py counts them, in both modes)
    max_bullet_line_fraction: Optional[float] = Field(0.9, ge=0, le=1, description="lines starting with a bullet")
    max_ellipsis_line_fraction: Optional[float] = Field(0.3, ge=0, le=1, description="lines ending in an ellipsis")
    max_duplicate_paragraph_fraction: Optional[float] = Field(0.3, ge=0, le=1)
    max_duplicate_line_char_fraction: Optional[float] = Field(0.2, ge=0, le=1)
    max_duplicate_paragraph_char_fraction: Optional[float] = Field(0.2, ge=0, le=1)
    definitions: Literal["ours", "published"] = Field(
        "ours", description="ours: the compiled counting; published: Gopher's and datatrove's (published.py)")

    @field_validator("top_ngram_char_fraction", "dup_ngram_char_fraction")
    @classmethod
    def _sizes(cls, v):
        if v and min(v) < 1:
            raise ValueError(f"n-gram sizes are words per n-gram, 1 or more (got {min(v)})")
        return v


# The reason names (manifest counts and removal log), in the order the rules are checked: cheap ones first.
RULES = ("doc_words", "mean_word_length", "symbol_word_ratio", "digit_fraction", "alpha_words", "stop_words",
         "duplicate_lines", "punctuation_lines", "top_ngram", "dup_ngram",
         # checked after the kernel's rules (published.extra_rules); appended, so the codes above keep their values
         "bullet_lines", "ellipsis_lines", "duplicate_paragraphs", "duplicate_paragraph_chars", "duplicate_line_chars")


class QualityFilter:
    """``check(text)`` -> None (keep) or the first failed rule's name (one of RULES).

    Every rule is evaluated in one compiled call per document (kernels.quality_code, numba): one pass over the
    text's code points splits the words as str.split() does and counts digits and words with a letter; stop words
    are compared there (lower-cased as str.lower does); words and lines are interned and the n-grams numbered with
    one hash table per size (exact: keys stored or compared whole), up to the sizes the rules need. Python only
    counts, for the rare text beyond the kernels' tables, digits and letters, and stop words when one of them is
    not ASCII. The verdicts equal the plain per-word version's
    (tests/data_prep/quality_reference.py) and the numpy version's this replaced (tests/data_prep/quality_numpy.py),
    compared on real and built text."""

    def __init__(self, cfg: QualityConfig):
        from data_prep.steps import kernels  # numba: imported only where a quality step runs

        self.c, self.k, self.tables, self.lower = cfg, kernels, kernels.char_tables(), kernels.lower_table()
        self.stop_words = frozenset(w.lower() for w in cfg.stop_words)
        # the ASCII stop word table, or none (offsets empty): a stop word is not ASCII, str.lower counts
        self.stop = kernels.stop_word_table(self.stop_words) or (np.zeros(0, np.uint8), np.zeros(0, np.int64))
        self.punct = np.array([ord(p) for p in TERMINAL_PUNCTUATION], dtype=np.uint32)
        rules = ([(n, lim, True) for n, lim in sorted((cfg.top_ngram_char_fraction or {}).items())]
                 + [(n, lim, False) for n, lim in sorted((cfg.dup_ngram_char_fraction or {}).items())])
        self.ngram_sizes = np.array([r[0] for r in rules], dtype=np.int64)
        self.ngram_limits = np.array([r[1] for r in rules], dtype=np.float64)
        self.ngram_top = np.array([r[2] for r in rules], dtype=np.bool_)
        self.ints, self.floats = _thresholds(cfg, kernels.NONE)
        self.unknown = np.full(3, -1, dtype=np.int64)  # no count taken by Python (quality_code's ``known``)
        from data_prep.steps.published import _extra_verdict

        self.extra = _extra_verdict
        self.has_extra = any(getattr(cfg, f) is not None for f in (
            "max_bullet_line_fraction", "max_ellipsis_line_fraction", "max_duplicate_paragraph_fraction",
            "max_duplicate_line_char_fraction", "max_duplicate_paragraph_char_fraction"))

    def check(self, text: str) -> Optional[str]:
        return self.evaluate(text)[0]

    def evaluate(self, text: str) -> "Tuple[Optional[str], object]":
        """(check's answer, the text's kernels.Words: MinHash reuses its word spans). One kernel call evaluates
        every rule in order; in the rare text it cannot count alone, Python takes that count and calls again."""
        k, cps, known = self.k, self.k.code_points(text), self.unknown
        while True:
            code, starts, ends = k.quality_code(cps, self.tables, self.lower, known, self.ints, self.floats,
                                                *self.stop, self.punct, self.ngram_sizes, self.ngram_limits,
                                                self.ngram_top)
            if code > 0:
                return RULES[code - 1], k.Words(cps, starts, ends)
            if code == 0:  # Gopher's line and paragraph rules, on the same code points
                why = self.extra(len(cps), *k.gopher_line_counts(cps, self.tables), self.c) if self.has_extra and \
                    len(cps) else None
                return why, k.Words(cps, starts, ends)
            known = known.copy()
            if code == k.NEED_CHAR_COUNTS:  # a code point above the kernels' tables: these two by str methods
                known[0], known[1] = count_digits(text), count_alpha_words(text.split())
            else:  # a stop word is not ASCII (the kernel compares ASCII stop words): str.lower counts
                known[2] = len(self.stop_words.intersection(text.lower().split()))


_INT64_MAX = (1 << 63) - 1


def _thresholds(c: QualityConfig, none: int) -> Tuple[np.ndarray, np.ndarray]:
    """The config's thresholds as kernels.quality_code takes them: ``none`` / NaN where a rule is off (null)."""
    ints = [none if v is None else min(v, _INT64_MAX) for v in (c.min_words, c.max_words, c.min_stop_words)]
    floats = [np.nan if v is None else float(v) for v in (
        c.min_mean_word_length, c.max_mean_word_length, c.max_symbol_word_ratio, c.max_digit_fraction,
        c.min_alpha_word_fraction, c.max_duplicate_line_fraction, c.min_punctuation_line_fraction)]
    return np.array(ints, dtype=np.int64), np.array(floats, dtype=np.float64)


_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_ASCII_LETTER = re.compile(r"[A-Za-z]")


def count_digits(text: str) -> int:
    """Characters for which str.isdigit(): ASCII digits counted in C, the rare others one by one."""
    n = sum(map(text.count, "0123456789"))
    if not text.isascii():
        n += sum(map(str.isdigit, _NON_ASCII.findall(text)))
    return n


def count_alpha_words(words: List[str]) -> int:
    """Words holding a character for which str.isalpha(): an ASCII letter found in C, and for the few words without
    one, their non-ASCII characters asked one by one."""
    none = list(compress(words, map(not_, map(_ASCII_LETTER.search, words))))
    return len(words) - len(none) + sum(1 for w in none if not w.isascii() and any(map(str.isalpha, w)))

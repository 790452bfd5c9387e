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
from typing import Dict, List, Optional

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

    @field_validator("top_ngram_char_fraction", "dup_ngram_char_fraction")
    @classmethod
    def _sizes(cls, v):
        if v and min(v) < 1:
            raise ValueError(f"n-gram sizes are words per n-gram, 1 or more (got {min(v)})")
        return v


# The reason names (manifest counts and removal log), in the order the rules are checked: cheap ones first.
RULES = ("doc_words", "mean_word_length", "symbol_word_ratio", "digit_fraction", "alpha_words", "stop_words",
         "duplicate_lines", "punctuation_lines", "top_ngram", "dup_ngram")


class QualityFilter:
    """``check(text)`` -> None (keep) or the first failed rule's name (one of RULES).

    Counting is compiled (kernels.py, numba): one pass over the text's code points splits the words as str.split()
    does and counts digits and words with a letter; words and lines are interned and the n-grams numbered with one
    hash table per size (exact: keys stored or compared whole), up to the sizes the rules need; stop words are
    compared there too. Python only counts, for the rare text beyond the kernels' tables, digits, letters and
    non-ASCII stop words. The verdicts equal the plain per-word version's
    (tests/data_prep/quality_reference.py) and the numpy version's this replaced (tests/data_prep/quality_numpy.py),
    compared on real and built text."""

    def __init__(self, cfg: QualityConfig):
        from data_prep.steps import kernels  # numba: imported only where a quality step runs

        self.c, self.k, self.tables = cfg, kernels, kernels.char_tables()
        self.stop_words = frozenset(w.lower() for w in cfg.stop_words)
        self.stop_table = kernels.stop_word_table(self.stop_words)
        self.punct = np.array([ord(p) for p in TERMINAL_PUNCTUATION], dtype=np.uint32)
        rules = ([(n, lim, True) for n, lim in sorted((cfg.top_ngram_char_fraction or {}).items())]
                 + [(n, lim, False) for n, lim in sorted((cfg.dup_ngram_char_fraction or {}).items())])
        self.ngram_sizes = np.array([r[0] for r in rules], dtype=np.int64)
        self.ngram_limits = np.array([r[1] for r in rules], dtype=np.float64)
        self.ngram_top = np.array([r[2] for r in rules], dtype=np.bool_)

    def check(self, text: str) -> Optional[str]:
        c = self.c
        cps = self.k.code_points(text)
        starts, ends, digits, alpha_words, symbols, beyond = self.k.scan_words(cps, self.tables)
        n = len(starts)
        if (c.min_words is not None and n < c.min_words) or (c.max_words is not None and n > c.max_words):
            return "doc_words"
        if n == 0:
            return None  # every other rule is a ratio over words
        lengths = ends - starts
        chars = int(lengths.sum())
        mean = chars / n
        if (c.min_mean_word_length is not None and mean < c.min_mean_word_length) or (
                c.max_mean_word_length is not None and mean > c.max_mean_word_length):
            return "mean_word_length"
        if c.max_symbol_word_ratio is not None and symbols / n > c.max_symbol_word_ratio:
            return "symbol_word_ratio"  # symbols: "#", "...", "\u2026" as str.count counts them
        if beyond:  # a code point above the kernels' tables: these two counts by str methods instead
            digits, alpha_words = count_digits(text), count_alpha_words(text.split())
        if c.max_digit_fraction is not None and digits / chars > c.max_digit_fraction:
            return "digit_fraction"
        if c.min_alpha_word_fraction is not None and alpha_words / n < c.min_alpha_word_fraction:
            return "alpha_words"
        # Gopher: "at least two of" the stop words (distinct), case-insensitive
        if c.min_stop_words is not None and self._stop_words(text, cps, starts, ends) < c.min_stop_words:
            return "stop_words"
        why = self._line_rules(cps)
        if why is None and len(self.ngram_sizes):
            r = self.k.ngram_rule(cps, starts, ends, self.ngram_sizes, self.ngram_limits, self.ngram_top)
            why = None if r < 0 else ("top_ngram" if self.ngram_top[r] else "dup_ngram")
        return why

    def _stop_words(self, text: str, cps: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
        """Distinct stop words in the lower-cased text: counted by the kernel, by str.lower where that may differ
        (a stop word or, when the kernel's count is short, the text not ASCII)."""
        if self.stop_table is not None:
            found = int(self.k.count_stop_words(cps, starts, ends, *self.stop_table))
            if found >= (self.c.min_stop_words or 0) or text.isascii():
                return found
        return len(self.stop_words.intersection(text.lower().split()))

    def _line_rules(self, cps: np.ndarray) -> Optional[str]:
        """Lines as ``[ln.strip() for ln in text.splitlines() if ln.strip()]``: the share occurring more than once
        (exact: lines interned as the words are), the share ending in terminal punctuation."""
        c = self.c
        if c.max_duplicate_line_fraction is None and c.min_punctuation_line_fraction is None:
            return None
        lines, dup, punct = self.k.line_counts(cps, self.tables, self.punct)
        if c.max_duplicate_line_fraction is not None and lines:
            if dup / lines > c.max_duplicate_line_fraction:
                return "duplicate_lines"
        if c.min_punctuation_line_fraction is not None and lines:
            if punct / lines < c.min_punctuation_line_fraction:
                return "punctuation_lines"
        return None


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

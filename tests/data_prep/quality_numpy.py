"""The quality rules' numpy version (data_prep/steps/filters.py before the compiled kernels, 2026-12): the words
numbered through a dict, each n-gram size numbered by a numpy ``unique`` over (previous id, next word id) pairs. Kept
as a second reference computed another way than the kernels (tests/data_prep/test_dp_quality_fast.py)."""

from __future__ import annotations

from collections import Counter
from operator import methodcaller
from typing import Dict, List, Optional

import numpy as np

from data_prep.steps.filters import TERMINAL_PUNCTUATION, QualityConfig, count_alpha_words, count_digits


class NumpyQualityFilter:
    """``check(text)`` -> None (keep) or the first failed rule's name (one of RULES).

    Counting runs in C, not a Python loop per character, word or n-gram: ASCII digits and words with an ASCII letter
    by str.count and regular expressions, only non-ASCII characters and words through str.isdigit / str.isalpha one
    by one (so the counts are those of the per-character definitions), and n-grams are numbered with numpy (each
    n-gram's id from the (n-1)-gram's id and the next word's id: exact, no hashing) to count repeats. The results equal the plain per-word version's
    (tests/data_prep/quality_reference.py; compared on real and built text)."""

    def __init__(self, cfg: QualityConfig):
        self.c = cfg
        self.stop_words = frozenset(w.lower() for w in cfg.stop_words)

    def check(self, text: str) -> Optional[str]:
        c = self.c
        words = text.split()
        n = len(words)
        if (c.min_words is not None and n < c.min_words) or (c.max_words is not None and n > c.max_words):
            return "doc_words"
        if n == 0:
            return None  # every other rule is a ratio over words
        chars = len("".join(words))
        mean = chars / n
        if (c.min_mean_word_length is not None and mean < c.min_mean_word_length) or (
                c.max_mean_word_length is not None and mean > c.max_mean_word_length):
            return "mean_word_length"
        if c.max_symbol_word_ratio is not None:
            symbols = text.count("#") + text.count("...") + text.count("\u2026")
            if symbols / n > c.max_symbol_word_ratio:
                return "symbol_word_ratio"
        if c.max_digit_fraction is not None and count_digits(text) / chars > c.max_digit_fraction:
            return "digit_fraction"
        if c.min_alpha_word_fraction is not None:
            if count_alpha_words(words) / n < c.min_alpha_word_fraction:
                return "alpha_words"
        # Gopher: "at least two of" the stop words (distinct), case-insensitive
        if c.min_stop_words is not None and len(self.stop_words.intersection(text.lower().split())) < c.min_stop_words:
            return "stop_words"
        why = self._line_rules(text)
        if why is None and (c.top_ngram_char_fraction or c.dup_ngram_char_fraction):
            why = self._ngram_rules(words, chars)
        return why

    def _line_rules(self, text: str) -> Optional[str]:
        c = self.c
        lines = [ln for ln in map(str.strip, text.splitlines()) if ln]
        if c.max_duplicate_line_fraction is not None and lines:
            counts = Counter(lines)
            dup = sum(k for k in counts.values() if k > 1)
            if dup / len(lines) > c.max_duplicate_line_fraction:
                return "duplicate_lines"
        if c.min_punctuation_line_fraction is not None and lines:
            ends = sum(map(methodcaller("endswith", TERMINAL_PUNCTUATION), lines))
            if ends / len(lines) < c.min_punctuation_line_fraction:
                return "punctuation_lines"
        return None

    def _ngram_rules(self, words: List[str], chars: int) -> Optional[str]:
        c = self.c
        grams = NgramIds(words)
        for size, limit in sorted((c.top_ngram_char_fraction or {}).items()):
            if grams.top_char_fraction(size, chars) > limit:
                return "top_ngram"
        for size, limit in sorted((c.dup_ngram_char_fraction or {}).items()):
            if grams.dup_char_fraction(size, chars) > limit:
                return "dup_ngram"
        return None


class NgramIds:
    """Words numbered, and n-grams numbered from them: gram_n[i] = the id of (gram_{n-1}[i], word[i + n - 1])."""

    def __init__(self, words: List[str]):
        ids: Dict[str, int] = {w: i for i, w in enumerate(dict.fromkeys(words))}
        self.word = np.fromiter(map(ids.__getitem__, words), dtype=np.int64, count=len(words))
        self.vocab = len(ids)
        self.lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        self.grams = {1: (self.word, self.vocab)}

    def ids(self, n: int):
        """(id of each n-gram in order, number of distinct ids)."""
        if n not in self.grams:
            prev, count = self.ids(n - 1)
            pair = prev[:-1] * self.vocab + self.word[n - 1:]
            uniq, inv = np.unique(pair, return_inverse=True)
            self.grams[n] = (inv.astype(np.int64), len(uniq))
        return self.grams[n]

    def top_char_fraction(self, n: int, chars: int) -> float:
        """As top_ngram_char_fraction: the first-seen of the most frequent n-grams (Counter.most_common's pick)."""
        if len(self.word) < n or not chars:
            return 0.0
        g, k = self.ids(n)
        counts = np.bincount(g, minlength=k)
        top = counts.max()
        if top < 2:
            return 0.0
        first = np.full(k, len(g), dtype=np.int64)
        np.minimum.at(first, g, np.arange(len(g)))
        at = int(first[counts == top].min())  # where the first of the most frequent n-grams first occurs
        return int(self.lengths[at : at + n].sum()) * int(top) / chars

    def dup_char_fraction(self, n: int, chars: int) -> float:
        """As dup_ngram_char_fraction: characters of words covered by an n-gram occurring more than once."""
        if len(self.word) < n or not chars:
            return 0.0
        g, k = self.ids(n)
        starts = np.flatnonzero(np.bincount(g, minlength=k)[g] > 1)
        if not len(starts):
            return 0.0
        edge = np.zeros(len(self.word) + 1, dtype=np.int64)
        np.add.at(edge, starts, 1)
        np.add.at(edge, starts + n, -1)
        covered = np.cumsum(edge[:-1]) > 0
        return int(self.lengths[covered].sum()) / chars

"""The quality rules as first written (plain Python, one word or n-gram tuple at a time): the reference the
vectorised data_prep/steps/filters.py is compared with (tests/data_prep/test_dp_quality_fast.py).

Heuristic quality filters (Gopher / C4 style): one document in, the name of the first rule it fails out (or None).

The rules and their default thresholds follow Gopher (Rae et al. 2021, appendix A: "quality filters" and "repetition
removal") as datatrove's GopherQualityFilter / GopherRepetitionFilter implement them, plus C4's "lines end in terminal
punctuation" (as a document-level fraction, datatrove's FineWeb filter's 0.12) and a digit-share rule. datatrove
itself is not a dependency (it pulls a whole pipeline framework); these are a few lines each.

Words are whitespace-separated tokens: language-agnostic and what the thresholds were tuned on (Gopher counts words
the same way). Every threshold is a field of ``QualityConfig``; ``null`` in the YAML turns that rule off.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Tuple

# The thresholds and word lists are the product's (the rules' code below is what is compared, not their constants).
from data_prep.steps.filters import (DUP_NGRAMS, GOPHER_STOP_WORDS, TERMINAL_PUNCTUATION,  # noqa: F401
                                     TOP_NGRAMS, QualityConfig)


# The reason names (manifest counts and removal log), in the order the rules are checked: cheap ones first.
RULES = ("doc_words", "mean_word_length", "symbol_word_ratio", "digit_fraction", "alpha_words", "stop_words",
         "duplicate_lines", "punctuation_lines", "top_ngram", "dup_ngram")


class ReferenceQualityFilter:
    """``check(text)`` -> None (keep) or the first failed rule's name (one of RULES)."""

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
        chars = sum(len(w) for w in words)
        mean = chars / n
        if (c.min_mean_word_length is not None and mean < c.min_mean_word_length) or (
                c.max_mean_word_length is not None and mean > c.max_mean_word_length):
            return "mean_word_length"
        if c.max_symbol_word_ratio is not None:
            symbols = text.count("#") + text.count("...") + text.count("\u2026")
            if symbols / n > c.max_symbol_word_ratio:
                return "symbol_word_ratio"
        if c.max_digit_fraction is not None and sum(ch.isdigit() for ch in text) / chars > c.max_digit_fraction:
            return "digit_fraction"
        if c.min_alpha_word_fraction is not None:
            alpha = sum(1 for w in words if any(ch.isalpha() for ch in w))
            if alpha / n < c.min_alpha_word_fraction:
                return "alpha_words"
        # Gopher: "at least two of" the stop words (distinct), case-insensitive
        if c.min_stop_words is not None and len(self.stop_words.intersection(w.lower() for w in words)) < c.min_stop_words:
            return "stop_words"
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if c.max_duplicate_line_fraction is not None and lines:
            counts = Counter(lines)
            dup = sum(k for k in counts.values() if k > 1)
            if dup / len(lines) > c.max_duplicate_line_fraction:
                return "duplicate_lines"
        if c.min_punctuation_line_fraction is not None and lines:
            ends = sum(1 for ln in lines if ln.endswith(TERMINAL_PUNCTUATION))
            if ends / len(lines) < c.min_punctuation_line_fraction:
                return "punctuation_lines"
        if c.top_ngram_char_fraction:
            for size, limit in sorted(c.top_ngram_char_fraction.items()):
                if top_ngram_char_fraction(words, size, chars) > limit:
                    return "top_ngram"
        if c.dup_ngram_char_fraction:
            for size, limit in sorted(c.dup_ngram_char_fraction.items()):
                if dup_ngram_char_fraction(words, size, chars) > limit:
                    return "dup_ngram"
        return gopher_line_rules(text, c)


def _repeats(items: List[str]) -> Tuple[int, int]:
    """(items equal to an earlier one, their characters): Gopher's count, where the first occurrence is no repeat."""
    counts = Counter(items)
    extra = {x: k - 1 for x, k in counts.items() if k > 1}
    return sum(extra.values()), sum(len(x) * k for x, k in extra.items())


def gopher_line_rules(text: str, c) -> Optional[str]:
    """The five rules checked after the kernel's, in their order, written out plainly."""
    raw = text.splitlines()
    if raw and c.max_bullet_line_fraction is not None:
        if sum(1 for ln in raw if ln.lstrip()[:1] in ("-", "\u2022")) / len(raw) > c.max_bullet_line_fraction:
            return "bullet_lines"
    if raw and c.max_ellipsis_line_fraction is not None:
        ends = sum(1 for ln in raw if ln.rstrip().endswith("...") or ln.rstrip().endswith("\u2026"))
        if ends / len(raw) > c.max_ellipsis_line_fraction:
            return "ellipsis_lines"
    paragraphs = [p for p in __import__("re").split("\n\n+", text.strip())]
    reps, rep_chars = _repeats(paragraphs)
    if c.max_duplicate_paragraph_fraction is not None and reps / len(paragraphs) > c.max_duplicate_paragraph_fraction:
        return "duplicate_paragraphs"
    if c.max_duplicate_paragraph_char_fraction is not None and text and \
            rep_chars / len(text) > c.max_duplicate_paragraph_char_fraction:
        return "duplicate_paragraph_chars"
    lines = [ln for ln in text.split("\n") if ln] or [""]
    if c.max_duplicate_line_char_fraction is not None and text and \
            _repeats(lines)[1] / len(text) > c.max_duplicate_line_char_fraction:
        return "duplicate_line_chars"
    return None


def _ngrams(words: List[str], n: int) -> List[Tuple[str, ...]]:
    return list(zip(*(words[i:] for i in range(n))))


def top_ngram_char_fraction(words: List[str], n: int, chars: int) -> float:
    """Characters (of its words) in all occurrences of the most frequent n-gram, over the words' characters."""
    grams = _ngrams(words, n)
    if not grams or not chars:
        return 0.0
    gram, count = Counter(grams).most_common(1)[0]
    if count < 2:
        return 0.0
    return sum(len(w) for w in gram) * count / chars


def dup_ngram_char_fraction(words: List[str], n: int, chars: int) -> float:
    """Characters of words covered by any n-gram that occurs more than once, over the words' characters (Gopher:
    each word counts once however many duplicated n-grams cover it)."""
    grams = _ngrams(words, n)
    if not grams or not chars:
        return 0.0
    counts = Counter(grams)
    covered = bytearray(len(words))
    for i, g in enumerate(grams):
        if counts[g] > 1:
            covered[i:i + n] = b"\x01" * n
    return sum(len(w) for w, cov in zip(words, covered) if cov) / chars

"""Gopher's rules as published (Rae et al. 2021, appendix A) and as datatrove's GopherQualityFilter and
GopherRepetitionFilter count them: the ``quality`` step with ``definitions: published``, and the five repetition and
line rules the compiled kernels do not have (``bullet_lines``, ``ellipsis_lines``, ``duplicate_paragraphs``,
``duplicate_line_chars``, ``duplicate_paragraph_chars``), which both modes check this way.

Where the published counting differs from the kernels' (``definitions: ours``, filters.py):
- duplicate lines and paragraphs count the repeats (second and later occurrences), over lines split at runs of
  newlines and not stripped, paragraphs at two or more newlines; ours counts every line of a repeated group, stripped;
- character fractions are over every character of the text (spaces included); the n-gram rules join an n-gram's words
  with spaces (top n-gram) or without (duplicate n-grams, counted greedily left to right); ours counts word characters;
- word-count and mean-length rules count "non-symbol" words (those with a character that is not punctuation: Unicode
  P*, ASCII symbols, control characters; datatrove uses a fixed list, which differs on a few non-ASCII symbols);
  the symbol rule counts "#" and "..." + "\u2026" separately; stop words are matched case-sensitively.
Words are whitespace-separated (datatrove's default is spaCy's tokenizer: give it whitespace words to compare).
``max_digit_fraction`` and ``min_punctuation_line_fraction`` (not Gopher's) keep the kernels' definitions.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from typing import List, Optional

from data_prep.steps.doc_steps import Doc, DocStep

_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")


def duplicates(items: List[str]) -> "tuple[int, int]":
    """(repeats, their characters): each element seen before counts, the first occurrence does not (all but one
    copy of each distinct element: counted by the set, in C)."""
    distinct = set(items)
    return len(items) - len(distinct), sum(map(len, items)) - sum(map(len, distinct))



@functools.lru_cache(maxsize=65536)
def _is_symbol_char(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] == "P" or cat == "Cc" or (ch.isascii() and cat[0] == "S")


def is_symbol_word(word: str) -> bool:
    return all(map(_is_symbol_char, word))


def top_ngram_chars(words: List[str], n: int) -> int:
    """Characters of the most frequent n-gram (words joined by spaces) times its count (first seen among equals)."""
    grams = Counter(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    gram, count = grams.most_common(1)[0]
    return len(gram) * count


def duplicate_ngram_chars(words: List[str], n: int) -> int:
    """Characters (words joined without spaces) of n-grams seen before, scanning left to right and jumping past each
    repeat: the published greedy count. N-grams are compared word by word (datatrove compares the words joined
    without spaces, so that "a bc" equals "ab c": a rare difference, kept out here)."""
    seen, chars, i = set(), 0, 0
    while i < len(words) - n + 1:
        gram = tuple(words[i:i + n])
        if gram in seen:
            chars += sum(map(len, gram))
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars


def extra_rules(text: str, cfg) -> Optional[str]:
    """The five rules the kernels lack, in the published counting; the first failed one's name or None. Counted in
    one compiled call (kernels.gopher_line_counts: tested equal to the str and re version, extra_rules_reference)."""
    if not text:
        return None
    from data_prep.steps import kernels

    lines, bullets, ellipses, pars, par_reps, par_chars, line_chars = kernels.gopher_line_counts(
        kernels.code_points(text), kernels.char_tables())
    return _extra_verdict(len(text), lines, bullets, ellipses, pars, par_reps, par_chars, line_chars, cfg)


def _extra_verdict(chars, lines, bullets, ellipses, pars, par_reps, par_chars, line_chars, cfg) -> Optional[str]:
    if lines and cfg.max_bullet_line_fraction is not None and bullets / lines > cfg.max_bullet_line_fraction:
        return "bullet_lines"
    if lines and cfg.max_ellipsis_line_fraction is not None and ellipses / lines > cfg.max_ellipsis_line_fraction:
        return "ellipsis_lines"
    if cfg.max_duplicate_paragraph_fraction is not None and par_reps / pars > cfg.max_duplicate_paragraph_fraction:
        return "duplicate_paragraphs"
    if cfg.max_duplicate_paragraph_char_fraction is not None and par_chars / chars > \
            cfg.max_duplicate_paragraph_char_fraction:
        return "duplicate_paragraph_chars"
    if cfg.max_duplicate_line_char_fraction is not None and line_chars / chars > cfg.max_duplicate_line_char_fraction:
        return "duplicate_line_chars"
    return None


def extra_rule_counts_reference(text: str) -> tuple:
    """gopher_line_counts's numbers by str and re, as datatrove's filters take them (the tests compare the two)."""
    lines = text.splitlines()
    paragraphs = _PARAGRAPHS.split(text.strip())
    par_reps, par_chars = duplicates(paragraphs)
    return (len(lines), sum(s.lstrip().startswith(("\u2022", "-")) for s in lines),
            sum(s.rstrip().endswith(("...", "\u2026")) for s in lines), len(paragraphs), par_reps, par_chars,
            duplicates(_LINES.split(text))[1])


@functools.lru_cache(maxsize=None)
def symbol_table():
    """uint8 per code point below 0x10000: 1 where _is_symbol_char (kernels.symbol_words reads it)."""
    import numpy as np

    return np.fromiter((_is_symbol_char(chr(c)) for c in range(0x10000)), dtype=np.uint8, count=0x10000)


class PublishedQuality(DocStep):
    """``quality`` with ``definitions: published``: the same fields and reason names, the published counting.

    The words and the n-gram rules are counted by compiled kernels (kernels.scan_words, published_ngram_rule,
    symbol_words); a text with a code point above U+FFFF (beyond the kernels' tables) takes the plain Python path,
    which the tests compare with it."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.stop_words = frozenset(cfg.stop_words)
        from data_prep.steps import kernels
        from data_prep.steps.filters import TERMINAL_PUNCTUATION

        self.punct, self.k, self.tables, self.symbols = TERMINAL_PUNCTUATION, kernels, kernels.char_tables(), \
            symbol_table()
        import numpy as np

        rules = ([(n, lim, True) for n, lim in sorted((cfg.top_ngram_char_fraction or {}).items())]
                 + [(n, lim, False) for n, lim in sorted((cfg.dup_ngram_char_fraction or {}).items())])
        self.sizes = np.array([r[0] for r in rules], dtype=np.int64)
        self.limits = np.array([r[1] for r in rules], dtype=np.float64)
        self.is_top = np.array([r[2] for r in rules], dtype=np.bool_)

    def apply(self, doc: Doc) -> Optional[str]:
        text = doc.text
        if not text:
            return "doc_words"
        k = self.k
        cps = k.code_points(text)
        starts, ends, _, alpha, _, beyond = k.scan_words(cps, self.tables)
        if beyond:  # characters above the kernels' tables: every count by str methods
            return self._repetition(text) or self._quality(text)
        return self._repetition(text, (cps, starts, ends)) or self._quality(text, (cps, starts, ends, alpha))

    def _repetition(self, text: str, scanned=None) -> Optional[str]:
        """GopherRepetitionFilter's order: paragraphs, lines, top n-grams, duplicate n-grams."""
        c = self.cfg
        paragraphs = _PARAGRAPHS.split(text.strip())
        n, chars = duplicates(paragraphs)
        if c.max_duplicate_paragraph_fraction is not None and n / len(paragraphs) > c.max_duplicate_paragraph_fraction:
            return "duplicate_paragraphs"
        if c.max_duplicate_paragraph_char_fraction is not None and chars / len(text) > \
                c.max_duplicate_paragraph_char_fraction:
            return "duplicate_paragraph_chars"
        lines = _LINES.split(text)
        n, chars = duplicates(lines)
        if c.max_duplicate_line_fraction is not None and n / len(lines) > c.max_duplicate_line_fraction:
            return "duplicate_lines"
        if c.max_duplicate_line_char_fraction is not None and chars / len(text) > c.max_duplicate_line_char_fraction:
            return "duplicate_line_chars"
        if scanned is not None:
            if not len(self.sizes):
                return None
            r = self.k.published_ngram_rule(*scanned, len(text), self.sizes, self.limits, self.is_top)
            return None if r < 0 else ("top_ngram" if self.is_top[r] else "dup_ngram")
        words = text.split()
        for size, limit in sorted((c.top_ngram_char_fraction or {}).items()):
            if len(words) >= size and top_ngram_chars(words, size) / len(text) > limit:
                return "top_ngram"
        for size, limit in sorted((c.dup_ngram_char_fraction or {}).items()):
            if duplicate_ngram_chars(words, size) / len(text) > limit:
                return "dup_ngram"
        return None

    def _quality(self, text: str, scanned=None) -> Optional[str]:
        """GopherQualityFilter's order, then the two rules that are not Gopher's."""
        c = self.cfg
        words = text.split()
        if scanned is not None:
            cps, starts, ends, alpha = scanned
            n_sym, sym_chars = self.k.symbol_words(cps, starts, ends, self.symbols)
            n_kept, kept_chars = len(words) - n_sym, int((ends - starts).sum()) - sym_chars
        else:
            kept = [w for w in words if not is_symbol_word(w)]
            n_kept, kept_chars = len(kept), sum(map(len, kept))
            alpha = sum(any(map(str.isalpha, w)) for w in words)
        if (c.min_words is not None and n_kept < c.min_words) or (c.max_words is not None and n_kept > c.max_words):
            return "doc_words"
        if not words:
            return None
        if n_kept:
            mean = kept_chars / n_kept
            if (c.min_mean_word_length is not None and mean < c.min_mean_word_length) or \
                    (c.max_mean_word_length is not None and mean > c.max_mean_word_length):
                return "mean_word_length"
        if c.max_symbol_word_ratio is not None and (
                text.count("#") / len(words) > c.max_symbol_word_ratio
                or (text.count("...") + text.count("\u2026")) / len(words) > c.max_symbol_word_ratio):
            return "symbol_word_ratio"
        why = extra_rules(text, _LinesOnly(c))
        if why:
            return why
        if c.min_alpha_word_fraction is not None and alpha / len(words) < c.min_alpha_word_fraction:
            return "alpha_words"
        if c.min_stop_words is not None and len(self.stop_words.intersection(words)) < c.min_stop_words:
            return "stop_words"
        return self._ours(text)

    def _ours(self, text: str) -> Optional[str]:
        c = self.cfg
        if c.max_digit_fraction is not None:
            from data_prep.steps.filters import count_digits

            chars = sum(map(len, text.split()))

            if chars and count_digits(text) / chars > c.max_digit_fraction:
                return "digit_fraction"
        if c.min_punctuation_line_fraction is not None:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            if lines and sum(ln.endswith(self.punct) for ln in lines) / len(lines) < c.min_punctuation_line_fraction:
                return "punctuation_lines"
        return None


class _LinesOnly:
    """The config seen by extra_rules from the quality part: its two line rules only (the repetition part checked
    paragraphs and line characters already)."""

    def __init__(self, cfg):
        self.max_bullet_line_fraction = cfg.max_bullet_line_fraction
        self.max_ellipsis_line_fraction = cfg.max_ellipsis_line_fraction
        self.max_duplicate_paragraph_fraction = None
        self.max_duplicate_paragraph_char_fraction = None
        self.max_duplicate_line_char_fraction = None

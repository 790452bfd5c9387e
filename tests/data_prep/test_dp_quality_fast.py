"""The compiled quality rules give the plain per-word version's verdicts (tests/data_prep/quality_reference.py) and
the numpy version's they replaced (tests/data_prep/quality_numpy.py), rule by rule, on real text, on each rule's built
failure and on text cut to cross every threshold; the kernels' character tables equal Python's str methods."""

import random

import numpy as np
import pytest
from tests.data_prep.quality_numpy import NgramIds, NumpyQualityFilter
from tests.data_prep.quality_reference import ReferenceQualityFilter, dup_ngram_char_fraction, top_ngram_char_fraction

from data_prep.steps import kernels
from data_prep.steps.filters import QualityConfig, QualityFilter, count_alpha_words, count_digits

pytestmark = pytest.mark.unit


def _variants(texts):
    rng = random.Random(5)
    out = list(texts)
    for t in texts[:150]:
        words = t.split()
        for k in (60, 200, 800):
            w = words[:k]
            out.append(" ".join(w + w[: k // 3]))  # repeated spans: n-gram rules
            out.append("\n".join(" ".join(w[i : i + 7]) for i in range(0, len(w), 7)))
        rng.shuffle(words)
        out.append(" ".join(words[:300]) + " ²³ ① ٣ Ⅻ ß é 漢字 x² ...#… .... ..... ...... ..##.. .")
        out.append(" ".join(words[:120]).upper().replace("K", "\u212a"))  # KELVIN SIGN: lower() gives 'k'
        out.append("\u2003".join(words[:90]) + " 𝟘𝟙 𝔸𝔹 😀 \ud800 ")  # beyond 0x10000, a lone surrogate
        seps = ["\n", "\r\n", "\r", "\n\r", "\x0b", "\x0c", "\x1c", "\x1e", "\x85", "\u2028", "\u2029", "\n \u3000\n"]
        lines = [" ".join(words[i:i + 6]) + rng.choice([".", "", " !", "\u3002", ")\t"]) for i in range(0, 240, 6)]
        out.append("".join(ln + rng.choice(seps) for ln in lines + lines[:15]))  # repeated lines, every boundary
    return out


CONFIGS = [QualityConfig(), QualityConfig(min_words=5, max_mean_word_length=30, max_digit_fraction=0.01,
                                          min_alpha_word_fraction=0.95, stop_words=["the", "and", "Kind", "über"]),
           QualityConfig(top_ngram_char_fraction={1: 0.3, 3: 0.05}, dup_ngram_char_fraction={2: 0.4, 12: 0.05},
                         min_stop_words=1, stop_words=["ok", "like"]),
           QualityConfig(**{f: None for f in ("min_words", "max_words", "min_mean_word_length",
                                              "max_mean_word_length", "max_symbol_word_ratio",
                                              "max_digit_fraction", "min_alpha_word_fraction", "min_stop_words",
                                              "max_duplicate_line_fraction", "min_punctuation_line_fraction")})]


def test_verdicts_equal_the_reference_and_the_numpy_version_for_every_config(texts):
    docs = _variants(texts)
    for cfg in CONFIGS:
        fast, ref, vec = QualityFilter(cfg), ReferenceQualityFilter(cfg), NumpyQualityFilter(cfg)
        verdicts = [fast.check(d) for d in docs]
        assert verdicts == [ref.check(d) for d in docs]
        assert verdicts == [vec.check(d) for d in docs]
        assert len(set(verdicts)) >= 3  # the texts exercise several rules


def test_kernel_counts_equal_str_methods(texts):
    """Word spans, digits and words with a letter from one pass over code points = str.split / isdigit / isalpha,
    and the kernels' tables = the str methods at every code point they cover."""
    chars = [chr(c) for c in range(0x10000)]
    t = kernels.char_tables()
    assert (t & 1).tolist() == [int(c.isspace()) for c in chars]
    assert ((t >> 1) & 1).tolist() == [int(c.isalpha()) for c in chars]
    assert ((t >> 2) & 1).tolist() == [int(c.isdigit()) for c in chars]
    assert ((t >> 3) & 1).tolist() == [int(len(("a" + c + "b").splitlines()) == 2) for c in chars]
    assert ((t >> 4) & 1).tolist() == [int(c in "#.\u2026") for c in chars]
    assert not any(len(("a" + chr(c) + "b").splitlines()) == 2 or chr(c).isspace() for c in range(0x10000, 0x110000))
    for d in _variants(texts)[::4]:
        cps = kernels.code_points(d)
        starts, ends, digits, alpha, symbols, beyond = kernels.scan_words(cps, t)
        assert symbols == d.count("#") + d.count("...") + d.count("\u2026")
        words = d.split()
        assert [d[a:b] for a, b in zip(starts.tolist(), ends.tolist())] == words
        assert beyond == any(ord(ch) >= 0x10000 for ch in d)
        if not beyond:
            assert digits == sum(ch.isdigit() for ch in d)
            assert alpha == sum(1 for w in words if any(ch.isalpha() for ch in w))
        ids, vocab = kernels.word_ids(cps, starts, ends)
        first = {}
        assert ids.tolist() == [first.setdefault(w, len(first)) for w in words] and vocab == len(first)
        lines = [ln for ln in map(str.strip, d.splitlines()) if ln]
        ls, le, punct = kernels.line_spans(cps, t, np.array([ord(p) for p in ".!?)"], dtype=np.uint32))
        assert [d[a:b] for a, b in zip(ls.tolist(), le.tolist())] == lines
        assert punct == sum(ln.endswith((".", "!", "?", ")")) for ln in lines)


def test_ngram_sizes_below_one_are_refused():
    with pytest.raises(ValueError, match="1 or more"):
        QualityConfig(dup_ngram_char_fraction={0: 0.1})


def test_numpy_counts_equal_per_character_and_per_ngram_definitions(texts):
    for d in _variants(texts)[::3]:
        words = d.split()
        assert count_digits(d) == sum(ch.isdigit() for ch in d)
        assert count_alpha_words(words) == sum(1 for w in words if any(ch.isalpha() for ch in w))
        chars = sum(map(len, words))
        grams = NgramIds(words)
        for n in range(2, 11):
            assert grams.top_char_fraction(n, chars) == pytest.approx(top_ngram_char_fraction(words, n, chars))
            assert grams.dup_char_fraction(n, chars) == pytest.approx(dup_ngram_char_fraction(words, n, chars))


def test_ties_between_most_frequent_ngrams_pick_the_first_seen():
    words = "bb cc a b bb cc a b zz".split()  # (bb, cc) and (a, b) both twice: Counter keeps the first seen
    chars = sum(map(len, words))
    assert NgramIds(words).top_char_fraction(2, chars) == top_ngram_char_fraction(words, 2, chars) == 8 / chars
    ids, vocab = kernels.word_ids(*(lambda c: (c, *kernels.scan_words(c, kernels.char_tables())[:2]))(
        kernels.code_points(" ".join(words))))
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    r = kernels.first_failed_ngram_rule(ids, vocab, lengths, chars, np.array([2]), np.array([8 / chars - 1e-9]),
                                        np.array([True]))
    assert r == 0  # the fraction is 8 / chars: just above this limit ...
    r = kernels.first_failed_ngram_rule(ids, vocab, lengths, chars, np.array([2]), np.array([8 / chars]),
                                        np.array([True]))
    assert r == -1  # ... and not above itself

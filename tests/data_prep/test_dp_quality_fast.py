"""The vectorised quality rules give the plain per-word version's verdicts (tests/data_prep/quality_reference.py),
rule by rule, on real text, on each rule's built failure and on text cut to cross every threshold."""

import random

import pytest
from tests.data_prep.quality_reference import ReferenceQualityFilter, dup_ngram_char_fraction, top_ngram_char_fraction

from data_prep.steps.filters import QualityConfig, QualityFilter, NgramIds, count_alpha_words, count_digits

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
        out.append(" ".join(words[:300]) + " ²³ ① ٣ Ⅻ ß é 漢字 x² ...#… ")
    return out


def test_verdicts_equal_the_reference_for_every_config(texts):
    docs = _variants(texts)
    configs = [QualityConfig(), QualityConfig(min_words=5, max_mean_word_length=30, max_digit_fraction=0.01,
                                              min_alpha_word_fraction=0.95),
               QualityConfig(**{f: None for f in ("min_words", "max_words", "min_mean_word_length",
                                                  "max_mean_word_length", "max_symbol_word_ratio",
                                                  "max_digit_fraction", "min_alpha_word_fraction", "min_stop_words",
                                                  "max_duplicate_line_fraction", "min_punctuation_line_fraction")})]
    for cfg in configs:
        fast, ref = QualityFilter(cfg), ReferenceQualityFilter(cfg)
        verdicts = [fast.check(d) for d in docs]
        assert verdicts == [ref.check(d) for d in docs]
        assert len(set(verdicts)) >= 3  # the texts exercise several rules


def test_counts_equal_per_character_and_per_ngram_definitions(texts):
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

"""Gopher's rules as published: the compiled counts (kernels.gopher_line_counts, published_ngram_rule,
symbol_words) equal the plain str/re definitions (published.py's Python path, the one datatrove's filters spell
out), on random texts built from the characters that matter (line boundaries, whitespace, bullets, dots) and on the
stdlib sample."""

import random

import numpy as np
import pytest

from data_prep.steps import kernels
from data_prep.steps.doc_steps import Doc
from data_prep.steps.filters import QualityConfig
from data_prep.steps.published import PublishedQuality, extra_rule_counts_reference

pytestmark = pytest.mark.unit

PIECES = ["-", "\u2022", ".", "...", "\u2026", " ", "\t", "\n", "\n\n", "\r", "\r\n", "\x0b", "\x85", "\u2028", "a",
          "b c", "the", "\u3000", "ab", "#", "!!", "x1"]


def _random_texts(n, seed=1, longest=14):
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, longest))) for _ in range(n)]


def test_line_and_paragraph_counts_equal_str_and_re():
    for t in _random_texts(6000) + ["", "\n", "a\n\nb\n\na", "x\r\n\r\ny", "  - a\n\u2022b\n c...  \n"]:
        got = [int(x) for x in kernels.gopher_line_counts(kernels.code_points(t), kernels.char_tables())]
        want = list(extra_rule_counts_reference(t))
        if want[4] == 0:  # no repeated paragraph: the kernel need not count the paragraphs (the fraction is 0)
            got[3] = want[3]
        assert got == want, repr(t)


class _Python(PublishedQuality):
    """The same step with every count taken by the plain Python path."""

    def apply(self, doc):
        return self._repetition(doc.text) or self._quality(doc.text) if doc.text else "doc_words"


@pytest.mark.parametrize("cfg", [
    QualityConfig(definitions="published", min_words=3, max_words=40),
    QualityConfig(definitions="published", min_words=1, top_ngram_char_fraction={2: 0.05, 3: 0.5},
                  dup_ngram_char_fraction={2: 0.01, 4: 0.05}, min_stop_words=None),
    QualityConfig(definitions="published", min_words=0, max_duplicate_paragraph_fraction=0.0,
                  max_ellipsis_line_fraction=0.0)])
def test_published_verdicts_compiled_equal_python(cfg, texts):
    fast, slow = PublishedQuality(cfg), _Python(cfg)
    words = " ".join(texts).split()
    rng = np.random.default_rng(5)
    docs = _random_texts(1000, seed=2, longest=60) + texts[::3]
    docs += [" ".join(rng.choice(words[:400], int(rng.integers(1, 80)))) for _ in range(300)]  # repeated n-grams
    seen = set()
    for t in docs:
        want = slow.apply(Doc(t))
        assert fast.apply(Doc(t)) == want, repr(t[:200])
        seen.add(want)
    assert len(seen) >= 4  # several rules fire: the comparison is not all "kept"


def test_symbol_words_equal_the_python_definition():
    from data_prep.steps.published import is_symbol_word, symbol_table

    for t in _random_texts(5000, seed=3) + ["# ... \u2026 -- a# !? \u00a9 \u2022"]:
        cps = kernels.code_points(t)
        starts, ends = kernels.scan_words(cps, kernels.char_tables())[:2]
        got = kernels.symbol_words(cps, starts, ends, symbol_table())
        sym = [w for w in t.split() if is_symbol_word(w)]
        assert tuple(int(x) for x in got) == (len(sym), sum(map(len, sym))), repr(t)


def test_bench_datatrove_refuses_clearly_without_datatrove(monkeypatch, tmp_path):
    import sys

    from data_prep.tools.bench_datatrove import bench_datatrove

    monkeypatch.setitem(sys.modules, "datatrove", None)  # as if not installed: import fails
    with pytest.raises(SystemExit, match="datatrove is not installed .it is not a dependency of this project."):
        bench_datatrove(str(tmp_path / "corpus.jsonl"))

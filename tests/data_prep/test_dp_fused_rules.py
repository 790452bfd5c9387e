"""The one-call quality kernel (kernels.quality_code) and what it hands MinHash: its word spans equal str.split()'s,
its verdicts the plain Python reference's on every path (a count taken by Python, empty text, rules off, negative
limits), its stop word count str.lower's for any text, and a signature from its spans (ASCII lower-casing in the
kernel, words over the kernel's 128 bytes hashed by the library) equals the one computed from the text alone and
the definition with Python integers."""

import numpy as np
import pytest
import xxhash
from tests.data_prep.quality_reference import ReferenceQualityFilter
from tests.data_prep.test_dp_minhash import reference_signature
from tests.data_prep.test_dp_quality_fast import CONFIGS, _variants

from data_prep.steps import curate as cu
from data_prep.steps import kernels
from data_prep.steps.dedup import MinHashDedupConfig, MinHasher
from data_prep.steps.filters import QualityConfig, QualityFilter
from data_prep.steps.step_list import step_list

pytestmark = pytest.mark.unit

LONG = "Supercalifragilistic" * 8  # 160 bytes: over the kernel's xxh3 limit (XXH3_MAX = 128)
EDGE = ["", " ", "\n\n", "one", "ONE TWO", LONG, f"The {LONG} and {LONG.upper()} of THE end " * 12,
        "Ünïcödé WÖRDS ａｎｄ 漢字 " * 30 + "\u00e9" * 70,  # a non-ASCII word over 128 bytes
        "THE \u212aIND OF \u0130STANBUL AND " * 20, "😀 " * 60]


def _docs(texts):
    return _variants(texts)[::3] + EDGE


def test_spans_and_verdicts_equal_the_reference_on_every_path(texts, monkeypatch):
    docs = _docs(texts)
    negative = QualityConfig(min_words=1, top_ngram_char_fraction={2: 0.9}, dup_ngram_char_fraction={6: -0.01})
    codes, kernel = set(), kernels.quality_code

    def spy(*a):
        out = kernel(*a)
        codes.add(int(out[0]))
        return out

    monkeypatch.setattr(kernels, "quality_code", spy)
    for cfg in CONFIGS + [negative]:
        fast, ref = QualityFilter(cfg), ReferenceQualityFilter(cfg)
        for d in docs:
            why, words = fast.evaluate(d)
            assert why == ref.check(d), (cfg, d[:80])
            assert [d[a:b] for a, b in zip(words.starts.tolist(), words.ends.tolist())] == d.split()
            assert words.cps.tolist() == [ord(c) for c in d]
    assert codes == set(range(-2, 11))  # every rule failed somewhere, both counts taken by Python, kept


def test_stop_words_counted_as_str_lower_counts_them(texts):
    """Any text (KELVIN SIGN lower-cases to 'k', U+0130 to 'i' + U+0307), counted up to ``need`` and no further."""
    stop_words = ["the", "of", "and", "kind", "i", "\u0307", "to", "k"]
    table = kernels.stop_word_table([w for w in stop_words if w.isascii()])
    for d in _docs(texts)[::3]:
        cps = kernels.code_points(d)
        starts, ends, *_ = kernels.scan_words(cps, kernels.char_tables())
        want = len({w for w in stop_words if w.isascii()}.intersection(d.lower().split()))
        for need in (1, 2, 100):
            got = kernels.count_stop_words(cps, starts, ends, *table, kernels.lower_table(), need)
            assert got == min(want, need)


def test_lower_table_is_str_lower_and_nothing_else_lower_cases_to_ascii():
    """The facts the exact stop word count rests on, checked against this Python's own str.lower."""
    table = kernels.lower_table()
    for c in range(0x10000):
        low = chr(c).lower()
        assert table[c] == (ord(low) if len(low) == 1 and low.isascii() else 0)
        if len(low) != 1:  # U+0130 only: keeps a non-ASCII character, so it never equals an ASCII word
            assert not low.isascii()
        assert low.isspace() == chr(c).isspace() or len(low) != 1
    assert not any(any(ch.isascii() for ch in chr(c).lower()) for c in range(0x10000, 0x110000))


@pytest.mark.parametrize("lowercase", [True, False])
def test_signature_from_the_quality_spans_equals_the_text_alone_and_the_definition(texts, lowercase):
    h = MinHasher(MinHashDedupConfig(num_perm=32, lowercase=lowercase))
    qf = QualityFilter(QualityConfig())
    for d in texts[:6] + [t.upper() for t in texts[:4]] + EDGE:
        _, words = qf.evaluate(d)
        sig = h.signature(d, words)
        assert sig.tolist() == h.signature(d).tolist() == reference_signature(h, d), d[:60]


def test_ascii_lower_casing_in_the_word_hash_kernel_at_every_length():
    words = ["".join("aBcXyZ09-."[(i * 7 + k) % 10] for k in range(n)) for i, n in enumerate(list(range(140)) * 2)]
    cps = kernels.code_points("".join(words))
    ends = np.cumsum([len(w) for w in words]).astype(np.int64)
    starts = ends - np.array([len(w) for w in words], dtype=np.int64)
    got, long_words = kernels._word_hashes(cps, starts, ends, kernels.XXH3_SECRET, True)
    assert long_words.tolist() == [i for i, w in enumerate(words) if len(w) > kernels.XXH3_MAX]
    assert [int(x) for i, x in enumerate(got) if len(words[i]) <= kernels.XXH3_MAX] == \
        [xxhash.xxh3_64_intdigest(w.lower().encode()) for w in words if len(w) <= kernels.XXH3_MAX]


def test_hash_pass_signatures_equal_minhasher_on_the_text(texts):
    """The hash pass hands the quality step's spans to MinHash: the signatures it gathers are MinHasher's own."""
    lax = {f: None for f in ("min_mean_word_length", "max_mean_word_length", "max_symbol_word_ratio",
                             "max_digit_fraction", "min_alpha_word_fraction", "min_stop_words",
                             "max_duplicate_line_fraction", "min_punctuation_line_fraction",
                             "top_ngram_char_fraction", "dup_ngram_char_fraction")}
    sl = step_list({"steps": [{"quality": dict(lax, min_words=3)}, {"minhash_dedup": {}}], "buckets": 2})
    acc = cu._UnitHashes(sl.steps)
    docs = [t[:4000] for t in texts[:40]] + [t.upper()[:3000] for t in texts[:10]] + EDGE
    for i, d in enumerate(docs):
        acc.add(i, d)
    h, qf = MinHasher(sl.steps[1].cfg), QualityFilter(sl.steps[0].cfg)
    want = [(i, h.signature(d).tolist()) for i, d in enumerate(docs) if qf.check(d) is None]
    assert [(r, s.tolist()) for r, s in zip(acc.sig_refs[1], acc.sigs[1])] == want
    assert len(want) > 30

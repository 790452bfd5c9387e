"""The compiled MinHash equals its definition computed with Python integers and the numpy version it replaced, and
estimates Jaccard similarity."""

import random

import numpy as np
import pytest
import xxhash

from data_prep.steps.dedup import MinHashDedupConfig, MinHasher

pytestmark = pytest.mark.unit
MASK = (1 << 64) - 1


def _mix(x):
    x ^= x >> 30
    x = x * 0xBF58476D1CE4E5B9 & MASK
    x ^= x >> 27
    x = x * 0x94D049BB133111EB & MASK
    return x ^ (x >> 31)


def reference_signature(h: MinHasher, text: str):
    """The definition, one shingle and one permutation at a time, with Python's unbounded integers."""
    words = (text.lower() if h.cfg.lowercase else text).split()
    if not words:
        shingles = [0]
    else:
        wh = [xxhash.xxh3_64_intdigest(w.encode()) for w in words]
        n = min(h.cfg.shingle_words, len(wh))
        shingles = [_mix((sum(wh[i + k] * int(h.weights[k]) for k in range(n)) + n) & MASK)
                    for i in range(len(wh) - n + 1)]
    return [min((((int(a) * x + int(b)) & MASK) >> 32) for x in shingles) for a, b in zip(h.a, h.b)]


def numpy_signature(h: MinHasher, text: str, chunk: int = 4096):
    """The numpy version (data_prep/steps/dedup.py until 2026-12-02): shingles and permutations as array ops."""
    words = (text.lower() if h.cfg.lowercase else text).split()
    if not words:
        x = np.zeros(1, dtype=np.uint64)
    else:
        raw = " ".join(words).encode("utf-8", "surrogatepass").split(b" ")
        wh = np.fromiter(map(xxhash.xxh3_64_intdigest, raw), dtype=np.uint64, count=len(raw))
        n = min(h.cfg.shingle_words, len(wh))
        acc = np.zeros(len(wh) - n + 1, dtype=np.uint64)
        for k in range(n):
            acc += wh[k: len(wh) - n + 1 + k] * h.weights[k]
        x = acc + np.uint64(n)
        for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
            x = x ^ (x >> np.uint64(shift))
            x = x * np.uint64(mul) if mul else x
    low = np.full(h.cfg.num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
    for lo in range(0, len(x), chunk):
        low = np.minimum(low, (h.a[:, None] * x[lo: lo + chunk] + h.b[:, None]).min(axis=1))
    return (low >> np.uint64(32)).astype(np.uint32)


def test_signature_equals_its_definition(texts):
    h = MinHasher(MinHashDedupConfig(num_perm=32))
    for t in texts[:12] + ["", "one", "a b c d", "x " * 700, "Ünïcödé wörds ａｎｄ 漢字 " * 30]:
        assert h.signature(t).tolist() == reference_signature(h, t)


def test_signature_equals_the_numpy_version_on_real_text(texts):
    h = MinHasher(MinHashDedupConfig())
    with np.errstate(over="ignore"):
        for t in texts + ["", "x", "\u3000".join(texts[0].split()[:50])]:
            assert h.signature(t).tolist() == numpy_signature(h, t, chunk=300).tolist()


def test_agreement_estimates_jaccard():
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(5000)]
    base = [rng.choice(vocab) for _ in range(600)]
    h = MinHasher(MinHashDedupConfig(num_perm=256, shingle_words=3))

    def shingles(ws):
        return {tuple(ws[i : i + 3]) for i in range(len(ws) - 2)}

    for keep in (1.0, 0.9, 0.7, 0.4):
        other = [w if rng.random() < keep else rng.choice(vocab) for w in base]
        a, b = shingles(base), shingles(other)
        jaccard = len(a & b) / len(a | b)
        est = float((h.signature(" ".join(base)) == h.signature(" ".join(other))).mean())
        assert abs(est - jaccard) < 0.08, (keep, jaccard, est)


def test_compiled_xxh3_equals_the_library_at_every_length():
    rng = random.Random(2)
    alphabet = "abcxyz09é漢😀\ud800-."
    words = ["".join(rng.choice(alphabet) for _ in range(n)) for n in list(range(0, 140)) * 8]
    from data_prep.steps import kernels

    cps = kernels.code_points("".join(words))
    ends = np.cumsum([len(w) for w in words]).astype(np.int64)
    starts = ends - np.array([len(w) for w in words], dtype=np.int64)
    got, long_words = kernels.word_hashes(cps, starts, ends, kernels.XXH3_SECRET)
    raw = [w.encode("utf-8", "surrogatepass") for w in words]
    assert long_words.tolist() == [i for i, b in enumerate(raw) if len(b) > kernels.XXH3_MAX]
    assert [int(h) for i, h in enumerate(got) if len(raw[i]) <= kernels.XXH3_MAX] == \
        [xxhash.xxh3_64_intdigest(b) for b in raw if len(b) <= kernels.XXH3_MAX]

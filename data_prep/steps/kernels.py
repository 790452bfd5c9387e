"""Compiled counting for the quality rules (numba): a document's words, their per-character counts and its n-grams,
in one pass over its code points and one hash table per n-gram size, with no sort and no Python per word.

Exact, not approximate: words are interned in a hash table that compares their code points on a hash match, and an
n-gram of size n is the pair (id of its (n-1)-gram, id of its last word), stored whole in the table, so ids are
exact whatever the hash. Whitespace, ``str.isalpha`` and ``str.isdigit`` come from tables built here from Python's
own str methods (every code point below 0x10000); a document holding a code point above that (rare: emoji, historic
scripts) is flagged and its per-character counts are taken by filters.py's Python code instead. The rules' semantics
stay in filters.py (tested against tests/data_prep/quality_reference.py and against filters.py's numpy version).

Compiled on first use and cached on disk (``cache=True``: numba's cache beside this module, or its user cache
directory when that is read-only); the first call of a fresh process loads the cache (~0.1-0.3 s) or compiles
(a few seconds, once per machine and numba version). numba is imported only when a quality step runs.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

_TABLE = 0x10000
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@functools.lru_cache(maxsize=None)
def char_tables() -> np.ndarray:
    """uint8 per code point below 0x10000: bit 0 whitespace (str.split's), bit 1 str.isalpha, bit 2 str.isdigit."""
    chars = [chr(c) for c in range(_TABLE)]
    space = np.fromiter(map(str.isspace, chars), dtype=np.uint8, count=_TABLE)
    alpha = np.fromiter(map(str.isalpha, chars), dtype=np.uint8, count=_TABLE)
    digit = np.fromiter(map(str.isdigit, chars), dtype=np.uint8, count=_TABLE)
    return space | (alpha << 1) | (digit << 2)


def code_points(text: str) -> np.ndarray:
    """The text's code points as uint32 (lone surrogates kept). One dtype for every text: one compiled version of
    each kernel (a one-byte version for ASCII text would save ~2 ms per 4 MB and double the compile time)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


@njit(cache=True, nogil=True)
def _pow2_at_least(n):
    """(size, log2 size): the table size for n entries, at most half full."""
    size, bits = 16, 4
    while size < n:
        size *= 2
        bits += 1
    return size, bits


@njit(cache=True, nogil=True)
def scan_words(cps, tables):
    """(word starts, word ends, digits, words with a letter, beyond-table flag) of the text's code points; words
    split as str.split() does. Counts are of characters below 0x10000 only when the flag is set."""
    n = len(cps)
    starts = np.empty(n // 2 + 1, dtype=np.int64)
    ends = np.empty(n // 2 + 1, dtype=np.int64)
    words = digits = alpha_words = 0
    beyond = False
    in_word = has_alpha = False
    for i in range(n):
        c = np.int64(cps[i])
        t = tables[c] if c < _TABLE else np.uint8(0)
        beyond |= c >= _TABLE
        if t & 1:
            if in_word:
                ends[words] = i
                words += 1
                alpha_words += has_alpha
                in_word = False
            continue
        if not in_word:
            starts[words] = i
            in_word, has_alpha = True, False
        has_alpha |= (t & 2) != 0
        digits += (t >> 2) & 1
    if in_word:
        ends[words] = n
        words += 1
        alpha_words += has_alpha
    return starts[:words], ends[:words], digits, alpha_words, beyond


@njit(cache=True, nogil=True)
def word_ids(cps, starts, ends):
    """First-seen ids of the words (equal code points, equal id) and how many distinct words."""
    n = len(starts)
    size, _ = _pow2_at_least(2 * n + 2)
    slot_word = np.full(size, -1, dtype=np.int64)  # index of the word that first took the slot
    slot_hash = np.zeros(size, dtype=np.uint64)
    ids = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)  # id -> index of its first word
    vocab = 0
    for w in range(n):
        h = _FNV_OFFSET
        for i in range(starts[w], ends[w]):
            h = (h ^ np.uint64(cps[i])) * _FNV_PRIME
        s = np.int64(h & np.uint64(size - 1))
        while True:
            o = slot_word[s]
            if o < 0:
                slot_word[s], slot_hash[s] = w, h
                first[vocab] = w
                ids[w] = vocab
                vocab += 1
                break
            if slot_hash[s] == h and _same(cps, starts[o], ends[o], starts[w], ends[w]):
                ids[w] = ids[o]
                break
            s = (s + 1) & (size - 1)
    return ids, vocab


@njit(cache=True, nogil=True)
def _same(cps, a0, a1, b0, b1):
    if a1 - a0 != b1 - b0:
        return False
    for k in range(a1 - a0):
        if cps[a0 + k] != cps[b0 + k]:
            return False
    return True


@njit(cache=True, nogil=True)
def next_level(prev, prev_counts, word, n, vocab):
    """Ids of the n-grams (first-seen numbering) from the (n-1)-gram ids ``prev`` and the word ids, with the count
    of each id: the n-gram at i is the pair (prev[i], word[i + n - 1]), stored whole as one int64 key. An n-gram
    whose (n-1)-gram occurs once occurs once too: it gets a fresh id without a table look-up (most, past n = 3)."""
    m = len(word) - n + 1
    repeated = 0
    for i in range(m):
        repeated += prev_counts[prev[i]] > 1
    size, bits = _pow2_at_least(2 * repeated + 2)
    slot_key = np.full(size, -1, dtype=np.int64)
    slot_id = np.empty(size, dtype=np.int64)
    ids = np.empty(m, dtype=np.int64)
    counts = np.zeros(m, dtype=np.int64)
    distinct = 0
    shift = np.uint64(64 - bits)
    for i in range(m):
        if prev_counts[prev[i]] == 1:
            g = distinct
            distinct += 1
        else:
            key = prev[i] * vocab + word[i + n - 1]
            s = np.int64((np.uint64(key) * _GOLDEN) >> shift)
            while slot_key[s] >= 0 and slot_key[s] != key:
                s = (s + 1) & (size - 1)
            if slot_key[s] < 0:
                slot_key[s], slot_id[s] = key, distinct
                distinct += 1
            g = slot_id[s]
        ids[i] = g
        counts[g] += 1
    return ids, counts[:distinct]


@njit(cache=True, nogil=True)
def top_fraction(ids, counts, lengths, n, chars):
    """Characters in the most frequent n-gram (the first seen of equals) times its count, over ``chars``."""
    top = counts.max() if len(counts) else 0
    if top < 2:
        return 0.0
    at = 0
    while counts[ids[at]] != top:
        at += 1
    covered = 0
    for k in range(at, at + n):
        covered += lengths[k]
    return covered * top / chars


@njit(cache=True, nogil=True)
def dup_fraction(ids, counts, lengths, n, chars):
    """Characters of the words covered by an n-gram occurring more than once, over ``chars``."""
    until = 0
    covered = 0
    for i in range(len(lengths)):
        if i < len(ids) and counts[ids[i]] > 1:
            until = i + n
        if i < until:
            covered += lengths[i]
    return covered / chars


@njit(cache=True, nogil=True)
def first_failed_ngram_rule(word, vocab, lengths, chars, sizes, limits, is_top):
    """Index of the first rule (n-gram size, limit, top or dup) the document fails, or -1; the n-gram levels are
    built in order of size, as far as the rules need."""
    ids = word
    level = 1
    counts = np.bincount(word, minlength=vocab)
    for r in range(len(sizes)):
        n = sizes[r]
        if n < level:  # a size below the levels built so far (the dup sizes after the top ones): start again
            ids, counts, level = word, np.bincount(word, minlength=vocab), 1
        if len(word) < n or chars == 0:
            frac = 0.0
        else:
            while level < n:
                level += 1
                ids, counts = next_level(ids, counts, word, level, vocab)
            frac = top_fraction(ids, counts, lengths, n, chars) if is_top[r] else \
                dup_fraction(ids, counts, lengths, n, chars)
        if frac > limits[r]:
            return r
    return -1


def stop_word_table(stop_words) -> "tuple[np.ndarray, np.ndarray] | None":
    """The (lower-cased) stop words as code points and offsets, or None when one is not ASCII (count_stop_words
    compares ASCII only; the caller then asks Python)."""
    words = sorted(stop_words)
    if not all(w.isascii() for w in words):
        return None
    offsets = np.cumsum([0] + [len(w) for w in words]).astype(np.int64)
    return np.frombuffer("".join(words).encode("ascii"), dtype=np.uint8).copy(), offsets


@njit(cache=True, nogil=True)
def count_stop_words(cps, starts, ends, stop, offsets):
    """Distinct stop words among the words lower-cased, ASCII words only: exact for ASCII text; a non-ASCII
    character may lower-case to ASCII (U+212A KELVIN SIGN to 'k'), so when the count decides against a document
    that is not ASCII, the caller recounts with str.lower."""
    k = len(offsets) - 1
    found = np.zeros(k, dtype=np.bool_)
    for w in range(len(starts)):
        length = ends[w] - starts[w]
        for s in range(k):
            if found[s] or offsets[s + 1] - offsets[s] != length:
                continue
            same = True
            for j in range(length):
                c = np.int64(cps[starts[w] + j])
                if 65 <= c <= 90:
                    c += 32
                if c != stop[offsets[s] + j]:
                    same = False
                    break
            if same:
                found[s] = True
    return found.sum()


def warm_up() -> None:
    """Load (or compile) every kernel now: called by the driver before it forks its workers, so that they inherit
    them instead of each paying numba's start-up (~1 s of CPU per process with a warm cache)."""
    cps = code_points("warm up the kernels, up the kernels")
    starts, ends, *_ = scan_words(cps, char_tables())
    ids, vocab = word_ids(cps, starts, ends)
    stop, offsets = stop_word_table(["the"])
    count_stop_words(cps, starts, ends, stop, offsets)
    first_failed_ngram_rule(ids, vocab, ends - starts, int((ends - starts).sum()), np.array([2, 3], np.int64),
                            np.array([0.5, 0.5]), np.array([True, False]))

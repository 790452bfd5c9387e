"""Compiled counting for the quality rules (numba): a document's words, their per-character counts and its n-grams,
in one pass over its code points and one hash table per n-gram size, with no sort and no Python per word.

Exact, not approximate: words are interned in a hash table that compares their code points on a hash match, and an
n-gram of size n is the pair (id of its (n-1)-gram, id of its last word), stored whole in the table, so ids are
exact whatever the hash. Whitespace, ``str.isalpha`` and ``str.isdigit`` come from tables built here from Python's
own str methods (every code point below 0x10000); a document holding a code point above that (rare: emoji, historic
scripts) is flagged and its per-character counts are taken by filters.py's Python code instead. The whole rule
sequence runs in one call per document (``quality_code``: the rules in filters.RULES's order, the thresholds from
filters.QualityConfig), so no Python runs between rules; its word spans then serve MinHash (``word_signature``)
without a second scan. Tested against tests/data_prep/quality_reference.py (plain Python, one word at a time) and
tests/data_prep/quality_numpy.py (the numpy version the kernels replaced).

Compiled on first use and cached on disk (``cache=True``: numba's cache beside this module, or its user cache
directory when that is read-only); the first call of a fresh process loads the cache (~0.1-0.3 s) or compiles
(a few seconds, once per machine and numba version). numba is imported only when a quality step runs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import njit

_TABLE = 0x10000
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@functools.lru_cache(maxsize=None)
def char_tables() -> np.ndarray:
    """uint8 per code point below 0x10000: bit 0 whitespace (str.split's and str.strip's), bit 1 str.isalpha, bit 2
    str.isdigit, bit 3 a line boundary of str.splitlines (none lies above 0x10000), bit 4 a character of the
    symbol rule ("#", ".", "\u2026": scan_words looks at the rest only through bits 0-2)."""
    chars = [chr(c) for c in range(_TABLE)]
    space = np.fromiter(map(str.isspace, chars), dtype=np.uint8, count=_TABLE)
    alpha = np.fromiter(map(str.isalpha, chars), dtype=np.uint8, count=_TABLE)
    digit = np.fromiter(map(str.isdigit, chars), dtype=np.uint8, count=_TABLE)
    line = np.fromiter((len(("a" + c + "b").splitlines()) == 2 for c in chars), dtype=np.uint8, count=_TABLE)
    symbol = np.zeros(_TABLE, dtype=np.uint8)
    symbol[[ord("#"), ord("."), 0x2026]] = 1
    return space | (alpha << 1) | (digit << 2) | (line << 3) | (symbol << 4)


def code_points(text: str) -> np.ndarray:
    """The text's code points as uint32 (lone surrogates kept). One dtype for every text: one compiled version of
    each kernel (a one-byte version for ASCII text would save ~2 ms per 4 MB and double the compile time)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


class Words(NamedTuple):
    """A document's code points and its words' spans (str.split()'s), as the quality kernel scanned them: MinHash
    takes them from there instead of scanning the text again."""

    cps: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


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
    """(word starts, word ends, digits, words with a letter, symbols, beyond-table flag) of the text's code
    points; words split as str.split() does; symbols as text.count("#") + text.count("...") + text.count("\u2026")
    (a run of k dots holds k // 3 of "..."). Digits and letters count only characters below 0x10000: exact when
    the flag is not set. Word boundaries are counted, not branched on (a start or an end is written at every
    character, the count moves by 0 or 1): a branch per boundary mispredicts about once a word; the rare symbol
    characters (the table's bit 4) keep theirs."""
    n = len(cps)
    starts = np.empty(n // 2 + 2, dtype=np.int64)
    ends = np.empty(n // 2 + 2, dtype=np.int64)
    n_starts = n_ends = digits = alpha_words = symbols = dots = has_alpha = 0
    was_space = 1
    beyond = False
    for i in range(n):
        c = cps[i]
        if c < _TABLE:
            t = np.int64(tables[c])
        else:
            t = 0
            beyond = True
        if (t & 16) or dots:  # "#", "." or "\u2026", or the end of a run of dots
            if t & 16 and c == 46:
                dots += 1
            else:
                symbols += dots // 3 + ((t >> 4) & 1)
                dots = 0
        space = t & 1
        begins, stops = was_space & (space ^ 1), (was_space ^ 1) & space
        starts[n_starts] = i
        n_starts += begins
        ends[n_ends] = i
        n_ends += stops
        alpha_words += stops & has_alpha
        has_alpha = (has_alpha & (begins ^ 1)) | ((t >> 1) & 1)  # no whitespace character is a letter
        digits += (t >> 2) & 1
        was_space = space
    if not was_space:
        ends[n_ends] = n
        n_ends += 1
        alpha_words += has_alpha
    return starts[:n_starts], ends[:n_ends], digits, alpha_words, symbols + dots // 3, beyond


@njit(cache=True, nogil=True)
def line_spans(cps, tables, punct):
    """(starts, ends, how many end in a ``punct`` code point) of the non-empty lines, stripped, as
    ``[ln.strip() for ln in text.splitlines() if ln.strip()]`` gives them ("\\r\\n" is one boundary)."""
    n = len(cps)
    starts = np.empty(n // 2 + 1, dtype=np.int64)
    ends = np.empty(n // 2 + 1, dtype=np.int64)
    lines = ends_punct = 0
    i = 0
    while i < n:
        j = i  # the line is cps[i:j], then its boundary
        while j < n and not (cps[j] < _TABLE and tables[cps[j]] & 8):
            j += 1
        a, b = i, j
        while a < b and cps[a] < _TABLE and tables[cps[a]] & 1:
            a += 1
        while b > a and cps[b - 1] < _TABLE and tables[cps[b - 1]] & 1:
            b -= 1
        if b > a:
            starts[lines], ends[lines] = a, b
            lines += 1
            for p in punct:
                if cps[b - 1] == p:
                    ends_punct += 1
                    break
        i = j + 2 if j + 1 < n and cps[j] == 13 and cps[j + 1] == 10 else j + 1
    return starts[:lines], ends[:lines], ends_punct


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
    built in order of size, as far as the rules need, and no further once every n-gram of a level occurs once
    (then so does every longer one: both fractions are 0, as top_fraction and dup_fraction give them)."""
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
            while level < n and len(counts) < len(ids):  # as many ids as n-grams: each occurs once
                level += 1
                ids, counts = next_level(ids, counts, word, level, vocab)
            if len(counts) == len(ids):
                frac = 0.0
            else:
                frac = top_fraction(ids, counts, lengths, n, chars) if is_top[r] else \
                    dup_fraction(ids, counts, lengths, n, chars)
        if frac > limits[r]:
            return r
    return -1


@njit(cache=True, nogil=True)
def line_counts(cps, tables, punct):
    """(non-empty stripped lines, those occurring more than once, those ending in a ``punct`` code point): the
    line rules' three counts in one call (line_spans, then the lines interned as words are)."""
    starts, ends, ends_punct = line_spans(cps, tables, punct)
    if not len(starts):
        return 0, 0, ends_punct
    ids, vocab = word_ids(cps, starts, ends)
    counts = np.bincount(ids, minlength=vocab)
    dup = 0
    for i in range(len(ids)):
        dup += counts[ids[i]] > 1
    return len(starts), dup, ends_punct


@njit(cache=True, nogil=True)
def ngram_rule(cps, starts, ends, sizes, limits, is_top):
    """first_failed_ngram_rule over the words (interned here, lengths and characters counted here): one call."""
    ids, vocab = word_ids(cps, starts, ends)
    lengths = ends - starts
    return first_failed_ngram_rule(ids, vocab, lengths, lengths.sum(), sizes, limits, is_top)


def stop_word_table(stop_words) -> "tuple[np.ndarray, np.ndarray] | None":
    """The (lower-cased) stop words as code points and offsets, or None when one is not ASCII (count_stop_words
    compares ASCII only; the caller then asks str.lower)."""
    words = sorted(stop_words)
    if not all(w.isascii() for w in words):
        return None
    offsets = np.cumsum([0] + [len(w) for w in words]).astype(np.int64)
    return np.frombuffer("".join(words).encode("ascii"), dtype=np.uint8).copy(), offsets


@functools.lru_cache(maxsize=None)
def lower_table() -> np.ndarray:
    """uint8 per code point below 0x10000: the ASCII character ``str.lower`` gives it (A-Z, U+212A KELVIN SIGN ->
    a-z; an ASCII character -> itself), 0 where that is not one ASCII character. Python's only other lower-casing
    that gives ASCII is U+0130 -> "i" + U+0307, which stays non-ASCII, and none lies above 0x10000
    (tests/data_prep/test_dp_quality_fast.py), so the stop words of any text are counted here exactly."""
    lowered = [chr(c).lower() for c in range(_TABLE)]
    return np.array([ord(x) if len(x) == 1 and x.isascii() else 0 for x in lowered], dtype=np.uint8)


@njit(cache=True, nogil=True)
def count_stop_words(cps, starts, ends, stop, offsets, lower, need):
    """Distinct stop words (ASCII, lower-case) among the words lower-cased as str.lower does (``lower``: the
    lower_table), counting no further than ``need`` (the rule asks "at least need"): exact for every text."""
    k = len(offsets) - 1
    found = np.zeros(k, dtype=np.bool_)
    shortest, longest, count = 1 << 62, 0, 0
    for s in range(k):
        shortest, longest = min(shortest, offsets[s + 1] - offsets[s]), max(longest, offsets[s + 1] - offsets[s])
    for w in range(len(starts)):
        length = ends[w] - starts[w]
        if length < shortest or length > longest:
            continue
        for s in range(k):
            if found[s] or offsets[s + 1] - offsets[s] != length:
                continue
            same = True
            for j in range(length):
                c = cps[starts[w] + j]
                if c >= _TABLE or lower[c] != stop[offsets[s] + j]:
                    same = False
                    break
            if same:
                found[s] = True
                count += 1
                if count >= need:
                    return count
    return count


# --- the whole rule sequence in one call (filters.QualityFilter.check) ---------------------------------------------

# quality_code's answers besides 0 (kept) and k (the k-th of filters.RULES failed, 1-based): the rule to check next
# needs a count the kernel cannot take, Python takes it and calls again with it in ``known``.
NEED_CHAR_COUNTS = -1  # a code point above the tables: digits and words with a letter by str methods (known[0:2])
NEED_STOP_COUNT = -2  # stop words by str.lower (known[2]): a stop word is not ASCII (no table)
NONE = -1  # an integer threshold turned off (``null``); a float one is NaN


@njit(cache=True, nogil=True)
def _shape_rules(n, chars, symbols, floats):
    """Rules 2-3 (mean_word_length, symbol_word_ratio), exact from the scan's counts: the failed rule's code or 0."""
    mean = chars / n
    if (floats[0] == floats[0] and mean < floats[0]) or (floats[1] == floats[1] and mean > floats[1]):
        return 2
    if floats[2] == floats[2] and symbols / n > floats[2]:
        return 3
    return 0


@njit(cache=True, nogil=True)
def _char_rules(n, chars, digits, alpha_words, floats):
    """Rules 4-5 (digit_fraction, alpha_words): the failed rule's code or 0."""
    if floats[3] == floats[3] and digits / chars > floats[3]:
        return 4
    if floats[4] == floats[4] and alpha_words / n < floats[4]:
        return 5
    return 0


@njit(cache=True, nogil=True)
def _line_rules(cps, tables, punct, floats):
    """Rules 7-8 (duplicate_lines, punctuation_lines): the failed rule's code or 0."""
    if floats[5] != floats[5] and floats[6] != floats[6]:  # both off: no line split
        return 0
    lines, dup, ends_punct = line_counts(cps, tables, punct)
    if floats[5] == floats[5] and lines and dup / lines > floats[5]:
        return 7
    if floats[6] == floats[6] and lines and ends_punct / lines < floats[6]:
        return 8
    return 0


@njit(cache=True, nogil=True)
def quality_code(cps, tables, lower, known, ints, floats, stop, stop_offsets, punct, sizes, limits, is_top):
    """Every quality rule in order, in one call: (code, word starts, word ends). The code is 0 (kept), the 1-based
    index of the first failed rule in filters.RULES, or NEED_* (Python takes that count, calls again with it in
    ``known``: -1 where not known). One word scan feeds every rule, and its spans serve MinHash after (the caller
    keeps them): no Python between rules, one conversion to code points per document.
    ints: min_words, max_words, min_stop_words (NONE: off); floats: min/max mean word length, max symbol ratio,
    max digit fraction, min alpha word fraction, max duplicate line fraction, min punctuation line fraction (NaN:
    off); lower: lower_table(); stop / stop_offsets: the ASCII stop word table (no offsets: none, Python counts);
    sizes / limits / is_top: the n-gram rules, as first_failed_ngram_rule takes them."""
    starts, ends, digits, alpha_words, symbols, beyond = scan_words(cps, tables)
    n = len(starts)
    if (ints[0] != NONE and n < ints[0]) or (ints[1] != NONE and n > ints[1]):
        return 1, starts, ends
    if n == 0:
        return 0, starts, ends  # every other rule is a ratio over words
    chars = (ends - starts).sum()
    code = _shape_rules(n, chars, symbols, floats)
    if code:
        return code, starts, ends
    if known[0] >= 0:
        digits, alpha_words = known[0], known[1]
    elif beyond and (floats[3] == floats[3] or floats[4] == floats[4]):
        return NEED_CHAR_COUNTS, starts, ends  # digits and letters above the tables: str methods count them
    code = _char_rules(n, chars, digits, alpha_words, floats)
    if code:
        return code, starts, ends
    if ints[2] != NONE:  # Gopher: "at least two of" the stop words (distinct), case-insensitive
        found = known[2]
        if found < 0:
            if len(stop_offsets) == 0:
                return NEED_STOP_COUNT, starts, ends
            found = count_stop_words(cps, starts, ends, stop, stop_offsets, lower, ints[2])
        if found < ints[2]:
            return 6, starts, ends
    code = _line_rules(cps, tables, punct, floats)
    if code == 0 and len(sizes):
        r = ngram_rule(cps, starts, ends, sizes, limits, is_top)
        code = 0 if r < 0 else (9 if is_top[r] else 10)
    return code, starts, ends


def warm_up() -> None:
    """Load (or compile) every kernel the curation steps call, with the argument types they pass: called by the
    driver before it forks its workers, so that they inherit them instead of each paying numba's start-up (~1 s of
    CPU per process with a warm cache), and by launch/setup_env.sh to compile them once per checkout."""
    cps = code_points("warm up the kernels, up the kernels")
    tables = char_tables()
    stop, offsets = stop_word_table(["the"])
    sizes, limits, is_top = np.array([2, 3], np.int64), np.array([0.5, 0.5]), np.array([True, False])
    ints, floats = np.array([1, 100, 1], np.int64), np.full(7, 0.5)
    quality_code(cps, tables, lower_table(), np.full(3, -1, np.int64), ints, floats, stop, offsets,
                 np.array([46], dtype=np.uint32), sizes, limits, is_top)
    gopher_line_counts(cps, tables)
    starts, ends, *_ = scan_words(cps, tables)  # MinHash without a quality step before it
    published_ngram_rule(cps, starts, ends, len(cps), sizes, limits, is_top)  # definitions: published
    symbol_words(cps, starts, ends, np.zeros(_TABLE, dtype=np.uint8))
    word_hashes(cps, starts, ends, XXH3_SECRET)  # decontaminate, substring dedup
    one = np.ones(4, dtype=np.uint64)
    _, wh, _ = word_signature(cps, starts, ends, True, XXH3_SECRET, one[:2], 2, one, one)
    min_hashes(shingle_hashes(wh, one[:2], 2), one, one)  # the path of words over XXH3_MAX bytes


# --- MinHash (dedup.MinHasher) ------------------------------------------------------------------------------------

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True)
def shingle_hashes(wh, weights, n):
    """The n-word shingles' 64-bit hashes from the words' (``wh``): sum of word hash x position weight, plus n, then
    splitmix64's finalizer; arithmetic mod 2**64, as dedup.MinHasher defines it."""
    m = len(wh) - n + 1
    out = np.empty(m, dtype=np.uint64)
    for i in range(m):
        acc = np.uint64(n)
        for k in range(n):
            acc += wh[i + k] * weights[k]
        x = acc ^ (acc >> np.uint64(30))
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        out[i] = x ^ (x >> np.uint64(31))
    return out


@njit(cache=True, nogil=True)
def min_hashes(x, a, b):
    """For each permutation j, the least (a[j] * x + b[j]) mod 2**64 over the shingle hashes x, shifted right 32
    (the shift is monotonic: min then shift), as uint32: the MinHash signature."""
    low = np.full(len(a), np.uint64(0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    for i in range(len(x)):
        xi = x[i]
        for j in range(len(a)):
            v = a[j] * xi + b[j]
            if v < low[j]:
                low[j] = v
    out = np.empty(len(a), dtype=np.uint32)
    for j in range(len(a)):
        out[j] = np.uint32(low[j] >> np.uint64(32))
    return out


# xxh3-64 (seed 0) of words up to 128 bytes, as xxhash's xxh3_64_intdigest computes it (XXH3 0.8: the 0-16 and
# 17-128 byte paths, portable 64x64->128 multiply); longer words are hashed by the xxhash library (the caller).
XXH3_SECRET = np.array([
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
], dtype=np.uint8)
_P64_1, _P64_2, _P64_3 = np.uint64(0x9E3779B185EBCA87), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)
_AVALANCHE, _RRMXMX = np.uint64(0x165667919E3779F9), np.uint64(0x9FB21C651E98DF25)
_LOW32 = np.uint64(0xFFFFFFFF)
XXH3_MAX = 128  # longest word (bytes) hashed here


@njit(cache=True, nogil=True)
def _read_le(p, i, nbytes):
    """nbytes (4 or 8) bytes of p from i as a little-endian unsigned integer (XXH_readLE32/64)."""
    v = np.uint64(0)
    for k in range(nbytes):
        v |= np.uint64(p[i + k]) << np.uint64(8 * k)
    return v


@njit(cache=True, nogil=True)
def _fold128(a, b):
    """The 128-bit product of a and b, its low and high halves xor-ed."""
    a_lo, a_hi, b_lo, b_hi = a & _LOW32, a >> np.uint64(32), b & _LOW32, b >> np.uint64(32)
    lo_lo, hi_lo, lo_hi, hi_hi = a_lo * b_lo, a_hi * b_lo, a_lo * b_hi, a_hi * b_hi
    cross = (lo_lo >> np.uint64(32)) + (hi_lo & _LOW32) + lo_hi
    upper = (hi_lo >> np.uint64(32)) + (cross >> np.uint64(32)) + hi_hi
    lower = (cross << np.uint64(32)) | (lo_lo & _LOW32)
    return lower ^ upper


@njit(cache=True, nogil=True)
def _avalanche3(h):
    h ^= h >> np.uint64(37)
    h *= _AVALANCHE
    return h ^ (h >> np.uint64(32))


@njit(cache=True, nogil=True)
def _xxh3_short(p, n, s):
    """xxh3-64 of p[:n], n <= 16."""
    if n > 8:
        lo = _read_le(p, 0, 8) ^ (_read_le(s, 24, 8) ^ _read_le(s, 32, 8))
        hi = _read_le(p, n - 8, 8) ^ (_read_le(s, 40, 8) ^ _read_le(s, 48, 8))
        swapped = np.uint64(0)
        for k in range(8):
            swapped |= ((lo >> np.uint64(8 * k)) & np.uint64(0xFF)) << np.uint64(56 - 8 * k)
        return _avalanche3(np.uint64(n) + swapped + hi + _fold128(lo, hi))
    if n >= 4:
        h = _read_le(p, n - 4, 4) + (_read_le(p, 0, 4) << np.uint64(32))
        h ^= _read_le(s, 8, 8) ^ _read_le(s, 16, 8)
        h ^= ((h << np.uint64(49)) | (h >> np.uint64(15))) ^ ((h << np.uint64(24)) | (h >> np.uint64(40)))
        h *= _RRMXMX
        h ^= (h >> np.uint64(35)) + np.uint64(n)
        h *= _RRMXMX
        return h ^ (h >> np.uint64(28))
    if n > 0:
        combined = (np.uint64(p[0]) << np.uint64(16)) | (np.uint64(p[n >> 1]) << np.uint64(24)) | \
            np.uint64(p[n - 1]) | (np.uint64(n) << np.uint64(8))
        h = combined ^ (_read_le(s, 0, 4) ^ _read_le(s, 4, 4))
    else:
        h = _read_le(s, 56, 8) ^ _read_le(s, 64, 8)
    h ^= h >> np.uint64(33)
    h *= _P64_2
    h ^= h >> np.uint64(29)
    h *= _P64_3
    return h ^ (h >> np.uint64(32))


@njit(cache=True, nogil=True)
def _mix16(p, i, s, j):
    return _fold128(_read_le(p, i, 8) ^ _read_le(s, j, 8), _read_le(p, i + 8, 8) ^ _read_le(s, j + 8, 8))


@njit(cache=True, nogil=True)
def xxh3_64(p, n, s):
    """xxh3-64 (seed 0) of p[:n], n <= 128 (XXH3_MAX)."""
    if n <= 16:
        return _xxh3_short(p, n, s)
    acc = np.uint64(n) * _P64_1
    if n > 32:
        if n > 64:
            if n > 96:
                acc += _mix16(p, 48, s, 96) + _mix16(p, n - 64, s, 112)
            acc += _mix16(p, 32, s, 64) + _mix16(p, n - 48, s, 80)
        acc += _mix16(p, 16, s, 32) + _mix16(p, n - 32, s, 48)
    acc += _mix16(p, 0, s, 0) + _mix16(p, n - 16, s, 16)
    return _avalanche3(acc)


@njit(cache=True, nogil=True)
def _utf8(c, buf, at):
    """Code point c as UTF-8 at buf[at:] (a lone surrogate as its 3 bytes: 'surrogatepass'); the new end."""
    if c < 0x80:
        buf[at] = c
        return at + 1
    if c < 0x800:
        buf[at], buf[at + 1] = 0xC0 | (c >> 6), 0x80 | (c & 0x3F)
        return at + 2
    if c < 0x10000:
        buf[at], buf[at + 1], buf[at + 2] = 0xE0 | (c >> 12), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)
        return at + 3
    buf[at], buf[at + 1] = 0xF0 | (c >> 18), 0x80 | ((c >> 12) & 0x3F)
    buf[at + 2], buf[at + 3] = 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)
    return at + 4


@njit(cache=True, nogil=True)
def word_hashes(cps, starts, ends, secret):
    """xxh3-64 of each word's UTF-8 bytes; (hashes, indices of the words longer than XXH3_MAX bytes, left 0)."""
    return _word_hashes(cps, starts, ends, secret, False)


@njit(cache=True, nogil=True)
def _word_hashes(cps, starts, ends, secret, lower):
    """word_hashes, with A-Z read as a-z when ``lower`` (the caller's text is ASCII then: str.lower changes nothing
    else there, and the spans of the text are those of its lower-cased copy)."""
    out = np.zeros(len(starts), dtype=np.uint64)
    long_words = np.empty(len(starts), dtype=np.int64)
    n_long = 0
    buf = np.empty(XXH3_MAX + 4, dtype=np.uint8)
    for w in range(len(starts)):
        at = 0
        for i in range(starts[w], ends[w]):
            if at > XXH3_MAX:
                break
            c = np.int64(cps[i])
            if lower and 65 <= c <= 90:
                c += 32
            at = _utf8(c, buf, at)
        if at > XXH3_MAX:
            long_words[n_long] = w
            n_long += 1
        else:
            out[w] = xxh3_64(buf, at, secret)
    return out, long_words[:n_long]


@njit(cache=True, nogil=True)
def word_signature(cps, starts, ends, lower, secret, weights, shingle_words, a, b):
    """(MinHash signature, word hashes, words over XXH3_MAX bytes) of the words cps[starts[i]:ends[i]] (``lower``:
    as _word_hashes): word hashes, shingles and permutations in one call. When a word is over XXH3_MAX bytes the
    signature is left empty: the caller hashes those words with the library, then shingle_hashes and min_hashes."""
    wh, long_words = _word_hashes(cps, starts, ends, secret, lower)
    if len(long_words):
        return np.empty(0, dtype=np.uint32), wh, long_words
    if len(wh) == 0:
        x = np.zeros(1, dtype=np.uint64)  # the empty text: one (empty) shingle
    else:
        x = shingle_hashes(wh, weights, min(shingle_words, len(wh)))
    return min_hashes(x, a, b), wh, long_words


# --- Gopher's n-gram rules as published (published.py, ``definitions: published``) ---------------------------------


@njit(cache=True, nogil=True)
def _published_top(ids, counts, lengths, n):
    """Characters of the most frequent n-gram, its words joined by spaces, times its count (the first seen among
    equals; a count of 1 counts too, as Counter.most_common does)."""
    top = counts.max()
    at = 0
    while counts[ids[at]] != top:
        at += 1
    chars = n - 1
    for k in range(at, at + n):
        chars += lengths[k]
    return chars * top


@njit(cache=True, nogil=True)
def _published_dup(ids, lengths, n, distinct):
    """Characters (words joined without spaces) of n-grams seen before, scanning left to right and jumping n words
    past each repeat: the published greedy count."""
    seen = np.zeros(distinct, dtype=np.bool_)
    chars, i, m = 0, 0, len(ids)
    while i < m:
        if seen[ids[i]]:
            for k in range(i, i + n):
                chars += lengths[k]
            i += n
        else:
            seen[ids[i]] = True
            i += 1
    return chars


@njit(cache=True, nogil=True)
def published_ngram_rule(cps, starts, ends, text_len, sizes, limits, is_top):
    """Index of the first n-gram rule (sizes ascending within top, then dup) failed with the published counting
    (fractions over ``text_len``, every character of the text), or -1. N-grams are equal when their words are
    (interned exactly, as the ``ours`` rules do)."""
    word, vocab = word_ids(cps, starts, ends)
    lengths = ends - starts
    ids, counts, level = word, np.bincount(word, minlength=vocab), 1
    for r in range(len(sizes)):
        n = sizes[r]
        if len(word) < n:
            if is_top[r]:
                continue  # no n-gram: the rule is skipped
            frac = 0.0
        else:
            if n < level:  # the dup sizes after the top ones: the levels again from words
                ids, counts, level = word, np.bincount(word, minlength=vocab), 1
            while level < n and len(counts) < len(ids):  # as many ids as n-grams: each occurs once
                level += 1
                ids, counts = next_level(ids, counts, word, level, vocab)
            if len(counts) == len(ids):  # every n-gram of this size occurs once: the top one is the first
                frac = (n - 1 + lengths[:n].sum()) / text_len if is_top[r] else 0.0
            elif is_top[r]:
                frac = _published_top(ids, counts, lengths, n) / text_len
            else:
                frac = _published_dup(ids, lengths, n, len(counts)) / text_len
        if frac > limits[r]:
            return r
    return -1


@njit(cache=True, nogil=True)
def symbol_words(cps, starts, ends, symbol):
    """(words made only of ``symbol`` characters (a table below 0x10000), their characters); -1, -1 when a word
    holds a code point above the table (the caller asks Python)."""
    count = chars = 0
    for w in range(len(starts)):
        only = True
        for i in range(starts[w], ends[w]):
            c = cps[i]
            if c >= _TABLE:
                return -1, -1
            if not symbol[c]:
                only = False
                break
        if only:
            count += 1
            chars += ends[w] - starts[w]
    return count, chars


@njit(cache=True, nogil=True)
def _split_spans(cps, lo, hi, min_run):
    """[start, end) of the pieces of cps[lo:hi] between runs of at least ``min_run`` newlines (re.split's pieces,
    empty ones included)."""
    starts = np.empty(hi - lo + 1, dtype=np.int64)
    ends = np.empty(hi - lo + 1, dtype=np.int64)
    k, at, i = 0, lo, lo
    while i < hi:
        if cps[i] == 10:
            j = i
            while j < hi and cps[j] == 10:
                j += 1
            if j - i >= min_run:
                starts[k], ends[k] = at, i
                k += 1
                at = j
            i = j
        else:
            i += 1
    starts[k], ends[k] = at, hi
    return starts[:k + 1], ends[:k + 1]


@njit(cache=True, nogil=True)
def _repeats(cps, starts, ends):
    """(pieces equal to an earlier one, their code points)."""
    ids, vocab = word_ids(cps, starts, ends)
    seen = np.zeros(vocab, dtype=np.bool_)
    n = chars = 0
    for p in range(len(ids)):
        if seen[ids[p]]:
            n += 1
            chars += ends[p] - starts[p]
        else:
            seen[ids[p]] = True
    return n, chars


@njit(cache=True, nogil=True)
def _ends_hash(cps, a, b):
    """A hash of a span from its length and its first and last 8 code points: cheap, and exact use is kept by
    comparing spans whole on a hash match (_intern_hashed)."""
    h = (_FNV_OFFSET ^ np.uint64(b - a)) * _FNV_PRIME
    for i in range(a, min(a + 8, b)):
        h = (h ^ np.uint64(cps[i])) * _FNV_PRIME
    for i in range(max(a + 8, b - 8), b):
        h = (h ^ np.uint64(cps[i])) * _FNV_PRIME
    return h


@njit(cache=True, nogil=True)
def _intern_hashed(cps, starts, ends, hashes):
    """_repeats of spans whose FNV hashes are given (equal spans, equal hash; compared whole on a hash match)."""
    n = len(starts)
    size, _ = _pow2_at_least(2 * n + 2)
    slot = np.full(size, -1, dtype=np.int64)
    reps = chars = 0
    for w in range(n):
        s = np.int64(hashes[w] & np.uint64(size - 1))
        while True:
            o = slot[s]
            if o < 0:
                slot[s] = w
                break
            if hashes[o] == hashes[w] and _same(cps, starts[o], ends[o], starts[w], ends[w]):
                reps += 1
                chars += ends[w] - starts[w]
                break
            s = (s + 1) & (size - 1)
    return reps, chars


@njit(cache=True, nogil=True)
def _line_marks(cps, tables, a, b):
    """(starts with a bullet, ends in an ellipsis) for the line cps[a:b], whitespace stripped as str.strip does."""
    while a < b and cps[a] < _TABLE and tables[cps[a]] & 1:
        a += 1
    while b > a and cps[b - 1] < _TABLE and tables[cps[b - 1]] & 1:
        b -= 1
    if a == b:
        return 0, 0
    bullet = 1 if cps[a] == 45 or cps[a] == 0x2022 else 0
    dots = cps[b - 1] == 0x2026 or (b - a >= 3 and cps[b - 1] == 46 and cps[b - 2] == 46 and cps[b - 3] == 46)
    return bullet, 1 if dots else 0


@njit(cache=True, nogil=True)
def gopher_line_counts(cps, tables):
    """The counts of Gopher's five line and paragraph rules (published.extra_rules), in one call: (lines as
    str.splitlines gives them, those starting with "-" or "\u2022" after leading whitespace, those ending in "..."
    or "\u2026" before trailing whitespace, paragraphs of text.strip() split at 2+ newlines, repeated paragraphs,
    their code points, the code points of repeated pieces of the text split at newline runs). One pass finds the
    line boundaries (both kinds of line: "\n" is one of str.splitlines's boundaries); paragraphs take a second pass
    only when a piece repeats (a repeated paragraph repeats its pieces) or the strip cuts into a line."""
    n = len(cps)
    lines = bullets = ellipses = 0
    p_starts = np.empty(n // 2 + 1, dtype=np.int64)
    p_ends = np.empty(n // 2 + 1, dtype=np.int64)
    p_hash = np.empty(n // 2 + 1, dtype=np.uint64)
    pieces = p_at = l_at = 0
    for i in range(n):
        c = cps[i]
        if c >= _TABLE or not (tables[c] & 8):
            continue
        if c == 10:  # a newline ends a piece (re.split(r"\n+")): empty pieces hold no characters, not kept
            if i > p_at:
                p_starts[pieces], p_ends[pieces], p_hash[pieces] = p_at, i, _ends_hash(cps, p_at, i)
                pieces += 1
            p_at = i + 1
            if i > 0 and cps[i - 1] == 13:  # the "\n" of "\r\n" ends no second line
                l_at = i + 1
                continue
        lines += 1
        bullet, dots = _line_marks(cps, tables, l_at, i)
        bullets += bullet
        ellipses += dots
        l_at = i + 1
    if l_at < n:  # the last line, with no boundary after it
        lines += 1
        bullet, dots = _line_marks(cps, tables, l_at, n)
        bullets += bullet
        ellipses += dots
    if n > p_at:
        p_starts[pieces], p_ends[pieces], p_hash[pieces] = p_at, n, _ends_hash(cps, p_at, n)
        pieces += 1
    line_reps, line_chars = _intern_hashed(cps, p_starts[:pieces], p_ends[:pieces], p_hash[:pieces])
    lo, hi = 0, n
    while lo < hi and cps[lo] < _TABLE and tables[cps[lo]] & 1:
        lo += 1
    while hi > lo and cps[hi - 1] < _TABLE and tables[cps[hi - 1]] & 1:
        hi -= 1
    cut = (lo > 0 and cps[lo - 1] != 10) or (hi < n and cps[hi] != 10)
    if line_reps == 0 and not cut:  # no paragraph repeats: their count does not matter (a fraction of 0)
        return lines, bullets, ellipses, 1, 0, 0, line_chars
    ps, pe = _split_spans(cps, lo, hi, 2)
    par_reps, par_chars = _repeats(cps, ps, pe)
    return lines, bullets, ellipses, len(ps), par_reps, par_chars, line_chars

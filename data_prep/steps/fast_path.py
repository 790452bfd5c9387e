"""Fast path: the library's own ids, faster. First gigatoken (gigatoken_bpe.py: HF byte-level BPE and sentencepiece
BPE with byte fallback, normalizers honoured; Rust, ids out as one flat array), then tiktoken (tiktoken_bpe.py:
sentencepiece BPE and HF byte-level BPE whose merges and pre-tokenizer tiktoken can run; no cache, no per-piece
Python), else a piece cache: encode each distinct whitespace-delimited piece once, reuse it from a bounded cache.

The piece cache is exact only when the tokenizer never merges across those pieces, which is decided from the tokenizer's own settings:
- sentencepiece BPE (not unigram, whose float-score ties depend on context): split_by_whitespace on, whitespace as prefix (not suffix), whitespace escaped to U+2581. The text is
  normalized by the model's own normalizer (whole document, so whitespace collapsing, dummy prefix, NFKC are exactly the
  library's), cut before every U+2581, and each piece encoded by a copy of the model whose normalizer is identity.
  Works for remove_extra_whitespaces off, identity normalization and split_digits (Llama-style) too. Where the
  vocabulary allows it (no piece mixes letters, digits and other characters; byte fallback on), the cut is finer:
  runs of letters, of digits and of other characters, so far fewer and shorter distinct keys are encoded.
- Hugging Face byte-level BPE: no normalizer, a ByteLevel pre-tokenizer with its GPT-2 regex and add_prefix_space
  off; pieces are cut with the same regex and each encoded alone.
Anything else falls back to whole-document encoding. ``self_check`` compares each on sample texts at start (a
gigatoken mismatch falls back to tiktoken, a tiktoken one to the piece cache, each checked in turn).
"""

from __future__ import annotations

import json
import re
from array import array
from itertools import chain
from typing import List, Optional

import numpy as np

from data_prep.steps.gigatoken_bpe import GigatokenBPE
from data_prep.steps.tiktoken_bpe import GPT2_PATTERN, ByteLevelTiktoken, SentencePieceTiktoken
from data_prep.steps.tokenizers import HFTokenizer, SentencePieceTokenizer, Tokenizer
META = "\u2581"
# Character classes of the second-level cut (every character but U+2581 is in exactly one).
_LETTERS, _DIGITS, _OTHER = r"[^\W\d_]", r"\d", r"(?:[^\w" + META + r"]|_)"


class FastPathMismatch(Exception):
    pass


class _SentencePiecePieces:
    def __init__(self, tok: SentencePieceTokenizer):
        from sentencepiece import SentencePieceProcessor
        from sentencepiece import sentencepiece_model_pb2 as pb

        m = pb.ModelProto()
        m.ParseFromString(tok.sp.serialized_model_proto())
        ts, ns = m.trainer_spec, m.normalizer_spec
        why = []
        if ts.model_type == 1:
            # Unigram's Viterbi sums float scores along the whole text: equal-score segmentations of a word (e.g.
            # "0"+"00000" vs "00000"+"0") are broken differently in context and alone. Measured here; not exact.
            why.append("unigram model (ties in its Viterbi search depend on the surrounding text)")
        if not ts.split_by_whitespace:
            why.append("split_by_whitespace is off")
        if ts.treat_whitespace_as_suffix:
            why.append("treat_whitespace_as_suffix is on")
        if not ns.escape_whitespaces:
            why.append("escape_whitespaces is off")
        if any(META in p.piece.lstrip(META) for p in m.pieces if p.type in (1, 4)):  # NORMAL / USER_DEFINED
            why.append("some pieces contain U+2581 after other characters")
        self.reason = "; ".join(why) or None
        if self.reason:
            return
        self.sp = tok.sp
        # sentencepiece's SplitIntoWords: a word starts at each U+2581, or only at the first of a run of them when
        # allow_whitespace_only_pieces is on (Llama-style models).
        self.runs = ts.allow_whitespace_only_pieces
        self.word = re.compile(META + "+[^" + META + "]*")
        # Without mapping rules and whitespace collapsing, the model's normalization is: a U+2581 in front (dummy
        # prefix) and every space escaped to U+2581. It is then done part by part, so a long document never goes
        # through the library's normalizer whole (which holds ~15 bytes per character while it works).
        self.plain = not ns.precompiled_charsmap and not ns.remove_extra_whitespaces
        self.dummy = META if ns.add_dummy_prefix else ""
        ns.name = "identity"
        ns.precompiled_charsmap = b""
        ns.add_dummy_prefix = False
        ns.remove_extra_whitespaces = False
        self.raw = SentencePieceProcessor(model_proto=m.SerializeToString())
        # Finer cut: the normalized text is cut into runs of letters, of digits and of other characters (a U+2581
        # run stays on the run after it), each distinct run encoded once, as it is. Exact when no piece of the
        # vocabulary has two neighbouring characters of different classes (U+2581 aside), so no merge crosses such a
        # cut, and with byte fallback (without it, neighbouring unknown characters would be merged into one <unk>
        # across the cut). Code and prose have far fewer distinct runs than distinct words, and shorter ones.
        self.fine = None
        if ts.byte_fallback:
            pairs = {(a, b) for p in m.pieces if p.type in (1, 4, 5) for a, b in zip(p.piece, p.piece[1:])
                     if a != META and b != META}
            # letters | digits | other (split_digits models), else letters | the rest (digits merge with punctuation)
            for partition in ((_LETTERS, _DIGITS, _OTHER), (_LETTERS, "(?:" + _DIGITS + "|" + _OTHER + ")")):
                classes = [re.compile(c) for c in partition]
                cls = {ch: next(i for i, r in enumerate(classes) if r.fullmatch(ch)) for ch in set(chain(*pairs))}
                if all(cls[a] == cls[b] for a, b in pairs):
                    # like sentencepiece's words: a U+2581 run starts one (allow_whitespace_only_pieces), else
                    # each U+2581 does; keyed by ``runs``
                    body = "(?:" + "|".join(c + "+" for c in partition) + ")"
                    self.fine = {True: re.compile(META + "*" + body + "|" + META + "+"),
                                 False: re.compile(META + "?" + body + "|" + META)}
                    break

    def prepare(self, texts: List[str]) -> List[str]:
        """Each whole document normalized by the model's own normalizer (whitespace collapsing, dummy prefix, NFKC),
        or as it is where the normalization is plain (``part`` does it)."""
        return list(texts) if self.plain else self.sp.normalize(texts)

    def normalize(self, text: str) -> str:
        """The model's normalization of one whole document."""
        return self.part(text, True) if self.plain else self.sp.normalize(text)

    def part(self, text: str, first: bool) -> str:
        """The normalized form of a part of a prepared text."""
        if not self.plain:
            return text
        return (self.dummy if first else "") + text.replace(" ", META)

    def cut_points(self, text: str, every: int):
        """Positions, about ``every`` characters apart, where a piece starts whatever the text before and after: a
        U+2581 (a space, in plain texts) after any other character. The pieces of the parts between them are those
        of the whole text."""
        return _cut_points(text, every, " " if self.plain else META, lambda prev: prev not in (" ", META))

    def split(self, norm: str) -> List[str]:
        """[head] + pieces of a normalized text (or of a part of it that starts at a cut point: head "")."""
        if self.fine is not None:  # cut the whole text (head included); the runs are encoded as they are
            return [""] + self.fine[self.runs].findall(norm)
        if self.runs:
            head_end = norm.find(META)
            head = norm if head_end < 0 else norm[:head_end]
            return [head] + self.word.findall(norm, len(head))
        return norm.split(META)  # parts[1:] are words without their leading U+2581; encode_pieces restores it

    def encode_pieces(self, keys: List[str], first: bool) -> List[List[int]]:
        literal = first or self.runs or self.fine is not None
        return self.raw.encode(keys if literal else [META + k for k in keys], num_threads=1)


class _ByteLevelPieces:
    def __init__(self, tok: HFTokenizer):
        cfg = json.loads(tok.tok.to_str())
        why = []
        if cfg.get("normalizer") is not None:
            why.append("it has a normalizer")
        pre = cfg.get("pre_tokenizer") or {}
        if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
            why.append(f"pre-tokenizer is {pre.get('type')} (only ByteLevel with its regex is handled)")
        elif pre.get("add_prefix_space"):
            why.append("ByteLevel add_prefix_space is on")
        if (cfg.get("model") or {}).get("type") != "BPE":
            why.append("model is not BPE")
        if cfg.get("added_tokens"):
            # Added tokens are matched on the whole text before pre-tokenization; a piece cut could hide one.
            specials = [t for t in cfg["added_tokens"] if not t.get("special", False)]
            if specials:
                why.append("it has non-special added tokens")
        self.reason = "; ".join(why) or None
        if self.reason:
            return
        import regex

        self.pattern = regex.compile(GPT2_PATTERN)
        self.tok = tok
        # Special tokens written literally in a text are matched whole by the library: such texts go whole.
        self.specials = [t["content"] for t in cfg.get("added_tokens") or []]

    def prepare(self, texts):
        # Special tokens written literally in a text are matched whole by the library: such texts go whole (None).
        if not self.specials:
            return list(texts)
        return [None if any(s in t for s in self.specials) else t for t in texts]

    def cut_points(self, text: str, every: int):
        """Positions where the GPT-2 regex starts a match whatever the text around: a space after a letter or
        digit (no alternative of the regex runs from a non-space into a space; matching looks only forward)."""
        return _cut_points(text, every, " ", str.isalnum)

    def part(self, text, first):
        return text

    def split(self, text):
        return [""] + self.pattern.findall(text)

    def encode_pieces(self, keys, first):
        return self.tok.encode_batch(keys)


def _cut_points(text: str, every: int, sep: str, after_ok):
    """Positions of ``sep``, about ``every`` characters apart, whose preceding character passes ``after_ok``."""
    find, p = text.find, every
    while p < len(text):
        p = find(sep, p)
        if p < 0:
            return
        if after_ok(text[p - 1]):
            yield p
            p += every
        else:
            p += 1


def _pack(ids) -> bytes:
    return array("i", ids).tobytes()


class FastEncoder:
    """Same ids as ``tok.encode_batch``; faster where exact. ``active`` says whether the cache path is used.

    Memory stays flat whatever the corpus and its longest document: texts are cut (at points where the pieces do not
    depend on the text around them) into parts of about ``SEGMENT_CHARS`` and pieced in groups of that many
    characters, so the transient lists of piece strings stay small; the cache holds at most about 2 x ``max_cache``
    entries, each piece's ids as packed int32 bytes; each document's ids come out as one numpy array. With tiktoken
    there is no cache: a worker holds its batch, one document's normalized text and its ids.
    """

    SEGMENT_CHARS = 1 << 16

    def __init__(self, tok: Tokenizer, enabled: bool = True, max_cache: int = 8_192, gigatoken: bool = True):
        self.tok = tok
        self.max_cache = max_cache
        self.cache: dict = {}
        self.old: dict = {}
        self.splitter = None
        self.tiktoken = None  # a ByteLevelTiktoken or SentencePieceTiktoken where tiktoken gives the same ids
        self.gigatoken: Optional[GigatokenBPE] = None
        self.reason: Optional[str] = "disabled by --no-fast-path" if not enabled else None
        self.tiktoken_reason: Optional[str] = None  # why tiktoken is not used
        self.gigatoken_reason: Optional[str] = None  # why gigatoken is not used
        if enabled and gigatoken:
            self.gigatoken, self.gigatoken_reason = GigatokenBPE.build(tok)
        # The slower ways are built only when needed (gigatoken refused, or failing its self-check): building tiktoken's
        # ranks and the piece cache's checks costs seconds of start-up for a 32k vocabulary.
        if enabled and self.gigatoken is None:
            self._build_fallbacks()

    def _build_fallbacks(self) -> None:
        tok = self.tok
        if isinstance(tok, HFTokenizer):
            self.tiktoken, self.tiktoken_reason = ByteLevelTiktoken.build(tok.tok)
        if isinstance(tok, SentencePieceTokenizer):
            splitter = _SentencePiecePieces(tok)
        elif isinstance(tok, HFTokenizer):
            splitter = _ByteLevelPieces(tok)
        else:
            splitter = None
        if splitter is None:
            self.reason = "unknown tokenizer type"
        elif splitter.reason:
            self.reason = splitter.reason
        else:
            self.splitter = splitter
            if isinstance(tok, SentencePieceTokenizer):
                self.tiktoken, self.tiktoken_reason = SentencePieceTiktoken.build(tok.sp, splitter.normalize)

    @property
    def active(self) -> bool:
        return self.splitter is not None or self.tiktoken is not None or self.gigatoken is not None

    @property
    def method(self) -> str:
        """How texts are encoded: gigatoken, tiktoken, piece cache or the library (whole documents)."""
        if self.gigatoken:
            return "gigatoken"
        return "tiktoken" if self.tiktoken else "piece cache" if self.splitter else "library"

    def describe(self) -> str:
        """For the run's log: on (how), or off (why), with why each faster way is not used."""
        why = ""
        if self.gigatoken is None and self.gigatoken_reason:
            why += f"; not gigatoken: {self.gigatoken_reason}"
        if self.gigatoken is None and self.tiktoken is None and self.tiktoken_reason:
            why += f"; not tiktoken: {self.tiktoken_reason}"
        return f"on ({self.method}{why})" if self.active else f"off ({self.reason}{why})"

    def encode_batch(self, texts: List[str]) -> List[List[int]]:
        """Ids as lists, like the tokenizer's own encode_batch."""
        if not self.active:
            return self.tok.encode_batch(texts)
        return [a.tolist() for a in self.encode_arrays(texts)]

    def encode_flat(self, texts: List[str]):
        """(ids of all texts one after another, offsets of len(texts) + 1): no array per document on gigatoken."""
        if self.gigatoken is not None:
            return self._encode_gigatoken(texts)
        arrays = self.encode_arrays(texts)
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
        return flat, offsets

    def encode_arrays(self, texts: List[str]) -> List[np.ndarray]:
        """Ids of each text as an integer array."""
        if self.gigatoken is not None:
            flat, offsets = self._encode_gigatoken(texts)
            return [flat[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
        if self.tiktoken is not None:
            return self._encode_tiktoken(texts)
        if self.splitter is None:
            return [np.asarray(ids, dtype=np.int32) for ids in self.tok.encode_batch(texts)]
        prepared = self.splitter.prepare(texts)
        whole = [i for i, t in enumerate(prepared) if t is None]
        out: List = [None] * len(texts)
        for i, ids in zip(whole, self.tok.encode_batch([texts[i] for i in whole]) if whole else ()):
            out[i] = np.asarray(ids, dtype=np.int32)
        parts: List[List[bytes]] = [[] for _ in texts]  # packed ids of each document's segments, in order
        group, group_chars = [], 0
        for i, text in enumerate(prepared):
            if text is None:
                continue
            start = 0
            for end in chain(self.splitter.cut_points(text, self.SEGMENT_CHARS), (len(text),)):
                group.append((i, self.splitter.part(text[start:end], start == 0)))  # a whole slice is no copy
                group_chars += end - start
                start = end
                if group_chars >= self.SEGMENT_CHARS:
                    self._encode_group(group, parts)
                    group, group_chars = [], 0
        self._encode_group(group, parts)
        for i, text in enumerate(prepared):
            if text is not None:
                out[i] = np.frombuffer(b"".join(parts[i]), dtype=np.int32)
        return out

    def _encode_gigatoken(self, texts: List[str]):
        return self.gigatoken.encode_flat(texts, self.tok.encode_batch)

    def _encode_tiktoken(self, texts: List[str]) -> List[np.ndarray]:
        tt = self.tiktoken
        # Added tokens written literally in a text are matched whole by the library: such texts go to it.
        lib = [i for i, t in enumerate(texts) if tt.specials and any(s in t for s in tt.specials)]
        skip = set(lib)
        out = [None if i in skip else tt.encode(t) for i, t in enumerate(texts)]
        for i, ids in zip(lib, self.tok.encode_batch([texts[i] for i in lib]) if lib else ()):
            out[i] = np.asarray(ids, dtype=np.int32)
        return out

    def _encode_group(self, group, parts) -> None:
        """Piece, look up (encoding the pieces not cached yet) and append the packed ids of each (doc, segment)."""
        if not group:
            return
        if len(self.cache) > self.max_cache:
            # Two generations approximate LRU with bounded memory (at most 2 x max_cache entries + one group's
            # new pieces): pieces still in use are promoted back from the old generation instead of encoded again.
            self.old, self.cache = self.cache, {}
        cache = self.cache
        split = [self.splitter.split(seg) for _, seg in group]
        missing = set(chain.from_iterable(p[1:] for p in split))
        missing.difference_update(cache.keys())
        if missing and self.old:
            promote = missing.intersection(self.old.keys())
            for k in promote:
                cache[k] = self.old[k]
            missing.difference_update(promote)
        if missing:
            keys = list(missing)
            cache.update(zip(keys, map(_pack, self.splitter.encode_pieces(keys, first=False))))
        get = cache.__getitem__
        for (i, _), pieces in zip(group, split):
            if pieces[0]:  # text before the first U+2581 (no dummy prefix): encoded as is, not cached
                parts[i].append(_pack(self.splitter.encode_pieces([pieces[0]], first=True)[0]))
            parts[i].append(b"".join(map(get, pieces[1:])))

    def self_check(self, texts: List[str]) -> None:
        """Disable the fast path (with the reason) if it differs from whole-document encoding on these texts: tiktoken
        first (then the piece cache is checked in its place), then the piece cache."""
        if not self.active or not texts:
            return
        want = [list(a) for a in self.tok.encode_batch(texts)]
        if self.gigatoken is not None:
            bad = _first_difference(want, self.encode_arrays(texts))
            if bad is None:
                return
            self.gigatoken = None
            self.gigatoken_reason = f"self-check mismatch on sample document {bad}"
            self._build_fallbacks()
        if self.tiktoken is not None:
            bad = _first_difference(want, self._encode_tiktoken(texts))
            if bad is None:
                return
            self.tiktoken = None
            self.tiktoken_reason = f"self-check mismatch on sample document {bad}"
        if self.splitter is not None:
            bad = _first_difference(want, [a.tolist() for a in self.encode_arrays(texts)])
            if bad is not None:
                self.splitter = None
                self.cache, self.old = {}, {}
                self.reason = f"self-check mismatch on sample document {bad}"


def _first_difference(want: List[List[int]], got) -> Optional[int]:
    for i, (a, b) in enumerate(zip(want, got)):
        if a != (b.tolist() if isinstance(b, np.ndarray) else list(b)):
            return i
    return None

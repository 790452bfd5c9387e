"""A Hugging Face byte-level BPE tokenizer.json run by tiktoken, where tiktoken gives the same ids.

tiktoken (OpenAI's Rust BPE) splits with one regex and merges by rank, the rank being the id of the merged bytes;
the tokenizers library splits with its pre-tokenizer and merges by position in the merge list. The two agree when:
- there is no normalizer and the pre-tokenizer is one regex tiktoken can run: ByteLevel with its GPT-2 regex, or
  Split(regex, Isolated) followed by ByteLevel without regex (Llama-3 style); add_prefix_space off;
- merge order and id order agree (each merge makes a new token whose id is above the ids of earlier merges), so
  "lowest rank first" picks the same pair as "earliest merge first";
- every multi-byte token is made by a merge (tokens no merge makes are left out of the ranks: the library cannot
  produce them from the merges either), and each one is its own encoding in the library (tiktoken returns a piece
  that is a whole token directly, like the library's ``ignore_merges``).
``ByteLevelTiktoken.build`` checks all of that from the tokenizer.json and returns the reason when it does not hold;
the caller still compares ids with the library's on sample documents at start-up (FastEncoder.self_check).
Added tokens written in a text are matched by the library before splitting: texts holding one go to the library.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import List, Optional, Tuple

import numpy as np

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict:
    """GPT-2's byte <-> printable character table (the ByteLevel alphabet), inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _pattern(cfg: dict) -> Tuple[Optional[str], Optional[str]]:
    """(regex, None) when the pre-tokenizer is one regex split tiktoken can run, else (None, why)."""
    pre = cfg.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex", True):
        level, pattern = steps[0], GPT2_PATTERN
    elif (len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel"
          and not steps[1].get("use_regex", True)):
        split, level = steps
        pattern = (split.get("pattern") or {}).get("Regex")
        if pattern is None or split.get("behavior") != "Isolated" or split.get("invert"):
            return None, "its Split pre-tokenizer is not one isolated regex"
    else:
        return None, "its pre-tokenizer is not ByteLevel (or Split regex + ByteLevel)"
    if level.get("add_prefix_space"):
        return None, "ByteLevel add_prefix_space is on"
    return pattern, None


class ByteLevelTiktoken:
    """Encode texts with a tiktoken Encoding built from a byte-level BPE tokenizer.json (``build`` decides)."""

    def __init__(self, encoding, specials: List[str]):
        self.encoding = encoding
        self.specials = specials  # added tokens: a text holding one goes to the library whole

    @classmethod
    def build(cls, hf_tokenizer) -> Tuple[Optional["ByteLevelTiktoken"], Optional[str]]:
        """(encoder, None), or (None, the reason tiktoken cannot give the library's ids for this tokenizer)."""
        try:
            import tiktoken
        except ImportError:
            return None, "tiktoken is not installed"
        cfg = json.loads(hf_tokenizer.to_str())
        model = cfg.get("model") or {}
        if cfg.get("normalizer") is not None:
            return None, "it has a normalizer"
        if model.get("type") != "BPE":
            return None, "model is not BPE"
        if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            return None, "BPE dropout or subword prefix/suffix"
        pattern, why = _pattern(cfg)
        if why:
            return None, why
        u2b, vocab = _unicode_to_byte(), model.get("vocab") or {}
        ranks, last = {}, -1
        try:
            for token, i in vocab.items():
                if len(token) == 1:
                    ranks[bytes([u2b[token]])] = i
            if len(ranks) != 256:
                return None, f"only {len(ranks)} of the 256 byte tokens are in the vocabulary"
            for m in model.get("merges") or []:
                a, b = m if isinstance(m, list) else m.split(" ", 1)
                i = vocab[a + b]
                key = bytes(u2b[c] for c in a + b)
                if i <= last or key in ranks:
                    return None, "merge order and token id order differ"
                ranks[key], last = i, i
        except KeyError:
            return None, "a merge or token is not byte-level"
        specials = [t["content"] for t in cfg.get("added_tokens") or []]
        if any(not t.get("special", False) for t in cfg.get("added_tokens") or []):
            return None, "it has non-special added tokens"
        try:
            enc = tiktoken.Encoding("data_prep", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        except Exception as e:  # a regex tiktoken's engine does not take
            return None, f"tiktoken refused it ({e})"
        # Each merged token must be its own encoding in the library (tiktoken returns a whole-token piece as is).
        inv = {v: k for k, v in vocab.items()}
        for t in (inv[i] for i in ranks.values()):
            if len(t) > 1:
                toks = hf_tokenizer.model.tokenize(t)  # the BPE model alone: no pre-tokenizer
                if len(toks) != 1 or toks[0].value != t:
                    return None, f"token {t!r} is not its own encoding in the library"
        return cls(enc, specials), None

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.encoding.encode_ordinary(text), dtype=np.int32)


META = "\u2581"


class SentencePieceTiktoken:
    """A sentencepiece BPE model run by tiktoken, where tiktoken gives the same ids.

    sentencepiece's BPE merges, within each word (a word starts at a U+2581, or at the first of a run of them with
    allow_whitespace_only_pieces), the neighbouring pair whose joined piece has the highest score, leftmost first;
    tiktoken merges the pair whose joined bytes have the lowest rank, leftmost first. So with ranks in score order
    and the words cut by tiktoken's regex, the merges are the same. tiktoken starts from bytes, sentencepiece from
    characters: every known character is assembled from its bytes first (its byte prefixes rank below every piece);
    a character not in the vocabulary stays bytes, which is sentencepiece's byte fallback. tiktoken's ranks are
    its output ids, so a table maps them to the model's ids. Text is normalized first as the model does (the whole
    document through the model's normalizer, or, for identity models, a U+2581 in front and spaces escaped).
    """

    specials: List[str] = []

    def __init__(self, encoding, table: np.ndarray, partial: dict, normalize):
        self.encoding, self.table, self.partial, self.normalize = encoding, table, partial, normalize

    @classmethod
    def build(cls, sp, normalize) -> Tuple[Optional["SentencePieceTiktoken"], Optional[str]]:
        """``sp``: the model's SentencePieceProcessor; ``normalize(text) -> str``: its normalization."""
        try:
            import tiktoken
            from sentencepiece import SentencePieceProcessor
            from sentencepiece import sentencepiece_model_pb2 as pb
        except ImportError:
            return None, "tiktoken is not installed"
        m = pb.ModelProto()
        m.ParseFromString(sp.serialized_model_proto())
        ts, ns = m.trainer_spec, m.normalizer_spec
        if ts.model_type != 2:
            return None, "not a BPE model"
        if not ts.byte_fallback:
            return None, "byte fallback is off (unknown characters become <unk>, not bytes)"
        if not ts.split_by_whitespace or ts.treat_whitespace_as_suffix or not ns.escape_whitespaces:
            return None, "words are not cut before U+2581"
        if any(p.type == 4 for p in m.pieces):
            return None, "it has user-defined pieces (matched before BPE)"
        NORMAL, BYTE = 1, 6
        ids = {p.piece: i for i, p in enumerate(m.pieces) if p.type == NORMAL}
        byte_id = {int(p.piece[3:5], 16): i for i, p in enumerate(m.pieces) if p.type == BYTE}
        if len(byte_id) != 256:
            return None, "the byte pieces are incomplete"
        chars = {p for p in ids if len(p) == 1}
        ranks: dict = {}
        table: List[int] = []
        partial: dict = {}  # rank of a byte prefix of a character -> the byte ids it stands for

        def add(key: bytes, out: int) -> None:
            if key not in ranks:
                ranks[key] = len(table)
                table.append(out)

        for b in range(256):  # single bytes: a known ASCII character, else its byte-fallback piece
            add(bytes([b]), ids[chr(b)] if b < 128 and chr(b) in chars else byte_id[b])
        for c in sorted(chars):  # every known character assembled from its bytes before any piece merge
            raw = c.encode()
            for k in range(2, len(raw)):
                if raw[:k] not in ranks:
                    partial[len(table)] = [byte_id[x] for x in raw[:k]]
                    add(raw[:k], -1)
            add(raw, ids[c])
        pieces = [(p.score, i, p.piece) for i, p in enumerate(m.pieces) if p.type == NORMAL and len(p.piece) > 1
                  and all(ch in chars for ch in p.piece)]  # pieces of unknown characters cannot be reached
        scores = [s for s, _, _ in pieces]
        if len(set(scores)) != len(scores):
            return None, "pieces share a score (sentencepiece breaks those ties by position, tiktoken cannot)"
        for _, i, piece in sorted(pieces, key=lambda x: -x[0]):
            add(piece.encode(), i)
        # tiktoken returns a word that is a whole piece as is: each piece must be its own encoding in the model.
        ns.name, ns.precompiled_charsmap, ns.add_dummy_prefix, ns.remove_extra_whitespaces = "identity", b"", False, False
        raw_sp = SentencePieceProcessor(model_proto=m.SerializeToString())
        multi = [p for _, _, p in pieces]
        for piece, got in zip(multi, raw_sp.encode(multi, num_threads=1)):
            if got != [ids[piece]]:
                return None, f"piece {piece!r} is not its own encoding in the model"
        # sentencepiece's words: from a U+2581 (or a run of them) to the next, and the text before the first
        word = f"{META}+[^{META}]*|[^{META}]+" if ts.allow_whitespace_only_pieces else f"{META}[^{META}]*|[^{META}]+"
        try:
            enc = tiktoken.Encoding("data_prep_sp", pat_str=word, mergeable_ranks=ranks, special_tokens={})
        except Exception as e:
            return None, f"tiktoken refused it ({e})"
        return cls(enc, np.asarray(table, dtype=np.int32), partial, normalize), None

    def encode(self, text: str) -> np.ndarray:
        if not text:  # no dummy prefix on an empty text
            return np.zeros(0, dtype=np.int32)
        ranks = self.encoding.encode_ordinary(self.normalize(text))
        out = self.table[np.asarray(ranks, dtype=np.int64)] if ranks else np.zeros(0, dtype=np.int32)
        if self.partial and (out < 0).any():
            # bytes of an unknown character that begin like a known one: tiktoken joined them part way
            out = np.asarray([j for r, i in zip(ranks, out.tolist()) for j in (self.partial[r] if i < 0 else (i,))],
                             dtype=np.int32)
        return out

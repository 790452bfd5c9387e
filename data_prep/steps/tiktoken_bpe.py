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
        merged = [inv[i] for i in ranks.values() if inv[i] is not None and len(inv[i]) > 1]
        got = hf_tokenizer.model.tokenize if hasattr(hf_tokenizer, "model") else None
        if got is not None:
            for t in merged:
                toks = got(t)
                if len(toks) != 1 or toks[0].value != t:
                    return None, f"token {t!r} is not its own encoding in the library"
        return cls(enc, specials), None

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.encoding.encode_ordinary(text), dtype=np.int32)

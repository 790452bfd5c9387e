"""A transformers tokenizer directory read without importing transformers (nor torch) when its files say the
tokenizer is its tokenizer.json as is.

transformers' AutoTokenizer costs ~2.4 s and ~220 MB per process to import (it pulls torch) only to pick the
tokenizer class. For the classes that wrap tokenizer.json unchanged (``PreTrainedTokenizerFast``; transformers 5
saves generic tokenizers as ``TokenizersBackend``) and without the options that make transformers rebuild parts of
the backend on load (``add_prefix_space``, ``from_slow``, ``legacy``), the tokenizers library's own reading of
tokenizer.json is the same tokenizer; the special tokens come from tokenizer_config.json (a string, or an
AddedToken's ``content``) and special_tokens_map.json, as transformers reads them. Any other directory returns None
and is loaded by transformers as before (tokenizers.HFTokenizer).
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple, Optional

PLAIN_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
REBUILDING_OPTIONS = ("add_prefix_space", "from_slow", "legacy")


class PlainDir(NamedTuple):
    tokenizer_json: str
    eos: Optional[str]
    bos: Optional[str]
    pad: Optional[str]


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _token(value) -> Optional[str]:
    if isinstance(value, dict):  # an AddedToken as transformers saves it
        value = value.get("content")
    return value if isinstance(value, str) else None


def plain_dir(path: str) -> Optional[PlainDir]:
    """The directory's tokenizer.json and special tokens when they are the whole tokenizer, else None."""
    cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
    tok_json = os.path.join(path, "tokenizer.json")
    if cfg is None or not os.path.isfile(tok_json) or cfg.get("tokenizer_class") not in PLAIN_CLASSES:
        return None
    if any(k in cfg for k in REBUILDING_OPTIONS):
        return None
    special = _read_json(os.path.join(path, "special_tokens_map.json")) or {}
    pick = lambda key: _token(cfg.get(key)) or _token(special.get(key))  # noqa: E731
    return PlainDir(tok_json, pick("eos_token"), pick("bos_token"), pick("pad_token"))


def load_plain_dir(path: str):
    """(tokenizers.Tokenizer, eos id, bos id, pad id) of a plain directory, or None (load it with transformers).
    A special token missing from the vocabulary (transformers would add it as a new token) also returns None."""
    plain = plain_dir(path)
    if plain is None:
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(plain.tokenizer_json)
    ids = []
    for t in (plain.eos, plain.bos, plain.pad):
        i = None if t is None else tok.token_to_id(t)
        if t is not None and i is None:
            return None
        ids.append(i)
    return (tok, *ids)

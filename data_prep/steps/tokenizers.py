"""Tokenizers: sentencepiece .model, Hugging Face tokenizer.json or a local transformers directory.

``load_tokenizer`` returns a ``Tokenizer`` whose ``encode_batch`` gives exactly the library's own encoding of each
text (no special tokens); EOD/BOS are added by the pipeline. ``FastEncoder`` (fast_path.py) wraps it with a cache of
whitespace-delimited pieces where that is exact. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from data_prep import io

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")


class TokenizerError(Exception):
    pass


def optimal_dtype(vocab_size: int):
    """Megatron's rule (megatron.core.datasets.indexed_dataset.DType.optimal_dtype)."""
    return np.uint16 if vocab_size < 65500 else np.int32


@dataclass
class TokenizerInfo:
    type: str  # sentencepiece | hf
    path: str
    vocab_size: int
    eod_id: int
    bos_id: Optional[int]
    pad_id: Optional[int]
    sha256: str

    def manifest_dict(self) -> dict:
        """The manifest's ``tokenizer`` entry."""
        return {
            "type": self.type,
            "path": self.path,
            "vocab_size": self.vocab_size,
            "eod_id": self.eod_id,
            "bos_id": self.bos_id,
            "pad_id": self.pad_id,
            "sha256": self.sha256,
        }

    @classmethod
    def from_manifest(cls, entry: dict) -> "TokenizerInfo":
        """Back from a manifest's ``tokenizer`` entry (what training reads); KeyError names a missing field, the
        optional ids (bos, pad) may be absent or null."""
        return cls(type=entry.get("type", ""), path=entry.get("path", ""), vocab_size=int(entry["vocab_size"]),
                   eod_id=int(entry["eod_id"]), bos_id=_opt_int(entry.get("bos_id")),
                   pad_id=_opt_int(entry.get("pad_id")), sha256=entry.get("sha256", ""))


def _opt_int(x) -> Optional[int]:
    return None if x is None else int(x)


class Tokenizer:
    info: TokenizerInfo

    def encode_batch(self, texts: List[str]) -> List[List[int]]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, path: str, eod_id: Optional[int] = None):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=path)
        eos = self.sp.eos_id() if eod_id is None else eod_id
        if eos < 0:
            raise TokenizerError(f"{path}: the sentencepiece model has no </s> (eos_id=-1); pass --eod-id N")
        opt = lambda i: None if i < 0 else int(i)  # noqa: E731
        self.info = TokenizerInfo(
            "sentencepiece", path, self.sp.get_piece_size(), int(eos), opt(self.sp.bos_id()), opt(self.sp.pad_id()),
            io.file_sha256(path),
        )

    def encode_batch(self, texts):
        return self.sp.encode(texts, num_threads=1)  # one core per worker process; the pool gives parallelism

    def decode(self, ids):
        return self.sp.decode([int(i) for i in ids])


class HFTokenizer(Tokenizer):
    """A tokenizer.json (tokenizers library) or a transformers directory (AutoTokenizer, local files only)."""

    def __init__(self, path: str, eod_id: Optional[int] = None):
        from tokenizers import Tokenizer as RustTokenizer

        bos = pad = eos = None
        plain = None
        if os.path.isdir(path):
            from data_prep.steps.tokenizer_dir import load_plain_dir

            plain = load_plain_dir(path)  # its tokenizer.json as is: no transformers import (tokenizer_dir.py)
        if plain is not None:
            self.tok, eos, bos, pad = plain
            digest_file = os.path.join(path, "tokenizer.json")
        elif os.path.isdir(path):
            from transformers import AutoTokenizer

            try:
                auto = AutoTokenizer.from_pretrained(path, local_files_only=True)
            except Exception as e:
                raise TokenizerError(f"{path}: not a loadable transformers tokenizer directory ({e})") from e
            backend = getattr(auto, "backend_tokenizer", None)
            if backend is None:
                raise TokenizerError(f"{path}: only fast (tokenizer.json backed) tokenizers are supported")
            self.tok = backend
            eos, bos, pad = auto.eos_token_id, auto.bos_token_id, auto.pad_token_id
            digest_file = os.path.join(path, "tokenizer.json")
        else:
            try:
                self.tok = RustTokenizer.from_file(path)
            except Exception as e:
                raise TokenizerError(f"{path}: not a tokenizer.json ({e})") from e
            digest_file = path
        vocab = self.tok.get_vocab(with_added_tokens=True)
        if eos is None:
            eos = next((vocab[t] for t in EOD_CANDIDATES if t in vocab), None)
        if bos is None:
            bos = next((vocab[t] for t in ("<s>", "<|begin_of_text|>", "<bos>") if t in vocab), None)
        if pad is None:
            pad = next((vocab[t] for t in ("<pad>", "[PAD]", "<|pad|>") if t in vocab), None)
        if eod_id is not None:
            eos = eod_id
        if eos is None:
            raise TokenizerError(
                f"{path}: no end-of-document token found (looked for {', '.join(EOD_CANDIDATES)}); pass --eod-id N"
            )
        size = max(self.tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
        sha = io.file_sha256(digest_file) if os.path.exists(digest_file) else hashlib.sha256(
            self.tok.to_str().encode()).hexdigest()
        self.info = TokenizerInfo("hf", path, size, int(eos), bos, pad, sha)

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)] if hasattr(
            self.tok, "encode_batch_fast") else [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


# What a transformers tokenizer directory holds (AutoTokenizer reads one of them)
TOKENIZER_DIR_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_tokenizer(path: str, eod_id: Optional[int] = None) -> Tokenizer:
    if not path:
        raise TokenizerError("no tokenizer given: pass --tokenizer PATH (.model, tokenizer.json or a directory)")
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise TokenizerError(
            f"tokenizer not found: {path} (train one with `python -m data_prep train-tokenizer`, or give a "
            "sentencepiece .model, a tokenizer.json or a local transformers directory)"
        )
    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_DIR_FILES):
        raise TokenizerError(f"{path} is a directory without a tokenizer (no {', '.join(TOKENIZER_DIR_FILES)}); give "
                             "a sentencepiece .model, a tokenizer.json, or a transformers directory holding one")
    if os.path.isdir(path) or path.endswith(".json"):
        tok: Tokenizer = HFTokenizer(path, eod_id)
    else:
        try:
            tok = SentencePieceTokenizer(path, eod_id)
        except TokenizerError:
            raise
        except Exception as e:
            raise TokenizerError(f"{path}: not a sentencepiece model ({e})") from e
    if eod_id is not None and not 0 <= eod_id < tok.info.vocab_size:
        raise TokenizerError(f"--eod-id {eod_id} is not an id of {path} (its vocabulary has {tok.info.vocab_size} ids, "
                             f"0..{tok.info.vocab_size - 1}); give the id of its end-of-document token, or leave "
                             "--eod-id out to use the tokenizer's own")
    return tok

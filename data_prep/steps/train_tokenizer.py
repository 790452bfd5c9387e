"""train-tokenizer: a sentencepiece BPE or unigram model (byte fallback) trained on a sample of the corpus."""

from __future__ import annotations

import os
from typing import Iterator, List

from data_prep import io
from data_prep.read.formats import read_piece
from data_prep.read.units import list_inputs


def sample_texts(inputs: List[str], text_field: str, max_bytes: int) -> Iterator[str]:
    """Documents in input order until ``max_bytes`` of text; rejected records are skipped."""
    seen = 0
    for piece in list_inputs(inputs):
        for _, text, _ in read_piece(piece, text_field):
            if text is None:
                continue
            yield text
            seen += len(text)
            if seen >= max_bytes:
                return


def train(inputs: List[str], model_prefix: str, vocab_size: int = 4000, model_type: str = "bpe",
          text_field: str = "text", sample_bytes: int = 20 << 20, max_sentence_length: int = 16384,
          threads: int = 1, quiet: bool = False, normalization: str = "identity") -> str:
    """Train and return the path of ``<model_prefix>.model``. Deterministic for the same inputs and settings.

    The default is lossless and Llama-style: identity normalization, whitespace kept as is (indentation and
    newlines survive, newlines via byte fallback), digits split, whitespace-only pieces allowed.
    ``normalization="nmt_nfkc"`` gives sentencepiece's classic defaults (NFKC, whitespace runs collapsed).
    """
    import sentencepiece as spm

    if model_type not in ("bpe", "unigram"):
        raise ValueError("--model-type must be bpe or unigram")
    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)) or ".", exist_ok=True)

    def lines():
        # sentencepiece trains on "sentences": feed document lines (bounded length), not whole documents.
        for text in sample_texts(inputs, text_field, sample_bytes):
            for line in text.splitlines():
                if line.strip():
                    yield line[:max_sentence_length]

    # Trained under a temporary name, then moved into place: a killed run leaves no half-written model, and an
    # identical rerun leaves the existing files (and their mtimes) alone.
    tmp_prefix = f"{model_prefix}.tmp-{os.getpid()}"
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines(),
        model_prefix=tmp_prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        byte_fallback=True,
        normalization_rule_name=normalization,
        remove_extra_whitespaces=normalization != "identity",
        split_digits=normalization == "identity",
        allow_whitespace_only_pieces=normalization == "identity",
        character_coverage=0.9995,
        max_sentence_length=max_sentence_length,
        pad_id=3,
        num_threads=threads,
        train_extremely_large_corpus=False,
        minloglevel=2 if quiet else 1,
    )
    # The model records the prefix it was trained under; give it the real one, so reruns are byte-identical.
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    with open(tmp_prefix + ".model", "rb") as f:
        m.ParseFromString(f.read())
    m.trainer_spec.model_prefix = model_prefix
    with open(tmp_prefix + ".model", "wb") as f:
        f.write(m.SerializeToString())
    for ext in (".vocab", ".model"):  # the .model last: its presence means the pair is complete
        io.replace_unless_identical(tmp_prefix + ext, model_prefix + ext)
    return model_prefix + ".model"

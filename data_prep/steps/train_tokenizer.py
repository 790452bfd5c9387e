"""train-tokenizer: a sentencepiece BPE or unigram model (byte fallback) trained on a sample of the corpus.

The vocabulary size is checked with the fix: below 256 byte pieces + 4 specials it is refused before the sample is
read; sentencepiece's own limits, known only once it has read the sample (the characters it must cover, the pieces
the sample can give), are turned from its internal errors into one line each, with the smallest or largest size
that works. A sample with no document (a wrong --text-field) is refused as a tokenize run would refuse it.
"""

from __future__ import annotations

import itertools
import os
import re
from collections import Counter
from typing import Iterator, List, Optional

from data_prep import io
from data_prep.read.diagnose import explain
from data_prep.read.formats import read_piece
from data_prep.read.probe import probe_inputs
from data_prep.read.units import list_inputs

BYTE_PIECES = 256  # byte fallback: one piece per byte value
SPECIAL_PIECES = 4  # <unk>, <s>, </s>, <pad> (pad_id=3 below)
# sentencepiece's checks, as its RuntimeError words them (trainer_interface.cc)
TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")
TOO_LARGE = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


class VocabSizeError(ValueError):
    """A --vocab-size sentencepiece cannot train with this sample: one line with the size that works."""


def sample_texts(inputs: List[str], text_field: str, max_bytes: int,
                 rejected: Optional[Counter] = None) -> Iterator[str]:
    """Documents in input order until ``max_bytes`` of text; rejected records are skipped (and counted by reason
    in ``rejected`` when given)."""
    seen = 0
    for piece in list_inputs(inputs):
        for _, text, reason in read_piece(piece, text_field):
            if text is None:
                if rejected is not None:
                    rejected[reason] += 1
                continue
            yield text
            seen += len(text)
            if seen >= max_bytes:
                return


def train(inputs: List[str], model_prefix: str, vocab_size: int = 4000, model_type: str = "bpe",
          text_field: str = "text", sample_bytes: int = 20 << 20, max_sentence_length: int = 16384,
          threads: int = 1, quiet: bool = False, normalization: str = "identity", overwrite: bool = False) -> str:
    """Train and return the path of ``<model_prefix>.model``. Deterministic for the same inputs and settings.

    The default is lossless and Llama-style: identity normalization, whitespace kept as is (indentation and
    newlines survive, newlines via byte fallback), digits split, whitespace-only pieces allowed.
    ``normalization="nmt_nfkc"`` gives sentencepiece's classic defaults (NFKC, whitespace runs collapsed).
    """
    if model_type not in ("bpe", "unigram"):
        raise ValueError("--model-type must be bpe or unigram")
    if model_prefix.endswith("/") or os.path.isdir(model_prefix):
        raise ValueError(f"-o {model_prefix} is a directory, but -o is a prefix: the model is written to PREFIX.model "
                         f"and PREFIX.vocab; give e.g. -o {os.path.join(model_prefix, 'sp')}")
    check_vocab_size(vocab_size)
    texts = _nonempty_sample(inputs, text_field, sample_bytes)
    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)) or ".", exist_ok=True)

    sampled = [0]  # characters handed to sentencepiece, for its "too high" message

    def lines():
        # sentencepiece trains on "sentences": feed document lines (bounded length), not whole documents.
        for text in texts:
            sampled[0] += len(text)
            for line in text.splitlines():
                if line.strip():
                    yield line[:max_sentence_length]

    # Trained under a temporary name, then moved into place: a killed run leaves no half-written model, and an
    # identical rerun leaves the existing files (and their mtimes) alone.
    tmp_prefix = f"{model_prefix}.tmp-{os.getpid()}"
    try:
        _train_sp(lines(), tmp_prefix, vocab_size, model_type, normalization, max_sentence_length, threads, quiet)
    except RuntimeError as e:
        _remove_partial(tmp_prefix)
        raise _vocab_error(e, vocab_size, sampled[0]) or e
    # The model records the prefix it was trained under; give it the real one, so reruns are byte-identical.
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    with open(tmp_prefix + ".model", "rb") as f:
        m.ParseFromString(f.read())
    m.trainer_spec.model_prefix = model_prefix
    with open(tmp_prefix + ".model", "wb") as f:
        f.write(m.SerializeToString())
    _keep_other_model(tmp_prefix, model_prefix, overwrite)
    for ext in (".vocab", ".model"):  # the .model last: its presence means the pair is complete
        io.replace_unless_identical(tmp_prefix + ext, model_prefix + ext)
    return model_prefix + ".model"


def _keep_other_model(tmp_prefix: str, model_prefix: str, overwrite: bool) -> None:
    """An existing PREFIX.model that differs from the one just trained is kept unless ``overwrite``: shards tokenized
    with it would no longer decode with the new one (ValueError, exit 2; the new one is discarded)."""
    import filecmp

    old = model_prefix + ".model"
    if overwrite or not os.path.exists(old) or filecmp.cmp(tmp_prefix + ".model", old, shallow=False):
        return
    _remove_partial(tmp_prefix)
    raise ValueError(f"{old} exists and differs from the tokenizer trained now (other inputs, --vocab-size or "
                     "options): shards tokenized with it would no longer decode; rerun with --overwrite to replace "
                     "it, or choose another -o/--model-prefix")


def _train_sp(sentences, prefix: str, vocab_size: int, model_type: str, normalization: str,
              max_sentence_length: int, threads: int, quiet: bool) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_prefix=prefix,
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


def check_vocab_size(vocab_size: int) -> None:
    """Refuse, before reading anything, a size that cannot even hold the byte pieces and the specials."""
    least = BYTE_PIECES + SPECIAL_PIECES + 1
    if vocab_size < least:
        raise VocabSizeError(f"--vocab-size {vocab_size} is too small: byte fallback needs {BYTE_PIECES} byte "
                             f"pieces plus {SPECIAL_PIECES} specials (<unk> <s> </s> <pad>) plus the sample's "
                             f"characters; use at least {least} (a few hundred more in practice; e.g. 32000)")


def _nonempty_sample(inputs: List[str], text_field: str, sample_bytes: int) -> Iterator[str]:
    """The sample's documents; refuses (ProbeError / ValueError, exit 2) a sample that holds none."""
    probe_inputs(list_inputs(inputs), text_field)  # a wrong --text-field: the fields seen and the fix
    rejected: Counter = Counter()
    texts = sample_texts(inputs, text_field, sample_bytes, rejected)
    first = next(texts, None)
    if first is None:
        if rejected:
            reason, n = rejected.most_common(1)[0]
            raise ValueError(f"train-tokenizer: no document in {' '.join(inputs)}: all {sum(rejected.values()):,} "
                             f"records were rejected, most as {reason} ({n:,}): {explain(reason, text_field)}")
        raise ValueError(f"train-tokenizer: {' '.join(inputs)} hold no records; give files of the corpus")
    return itertools.chain([first], texts)


def _vocab_error(e: RuntimeError, vocab_size: int, sampled_chars: int) -> Optional[VocabSizeError]:
    """sentencepiece's vocabulary-size failures, with the size that works; None for any other error."""
    small, large = TOO_SMALL.search(str(e)), TOO_LARGE.search(str(e))
    if small:
        need = int(small.group(2))
        return VocabSizeError(f"--vocab-size {vocab_size} is too small for this sample: {BYTE_PIECES} byte pieces, "
                              f"{SPECIAL_PIECES} specials and the {need - BYTE_PIECES - SPECIAL_PIECES} characters "
                              f"that cover 99.95% of the sample need at least {need}; use --vocab-size {need} or "
                              "more")
    if large:
        most = int(large.group(2))
        return VocabSizeError(f"--vocab-size {vocab_size} is more than this sample can give: its "
                              f"{sampled_chars:,} characters of text yield at most {most} pieces; use --vocab-size "
                              f"{most} or less, or a bigger sample (--sample-bytes, more input files)")
    return None


def _remove_partial(prefix: str) -> None:
    for ext in (".model", ".vocab"):
        try:
            os.remove(prefix + ext)
        except FileNotFoundError:
            pass

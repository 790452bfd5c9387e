"""The tokenizer the bench gives Megatron-LM's preprocess_data_fast.py for a sentencepiece family (an HF directory
whose tokenizer.json is gigatoken's conversion of the model) encodes as sentencepiece does, loaded by the
tokenizers library (what transformers' fast tokenizer in Megatron-LM's HuggingFaceTokenizer wraps), and names the
model's own eos as the EOD."""

import orjson
import pytest
import sentencepiece as spm
from tests.data_prep.test_dp_tiktoken import _docs

from data_prep.tools.bench import hf_dir_for_megatron_fast

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("model", ["sp_model", "sp_model_nfkc"])
def test_sentencepiece_model_as_hf_directory_gives_the_library_ids(model, texts, request):
    from tokenizers import Tokenizer

    path = request.getfixturevalue(model)
    d = hf_dir_for_megatron_fast(path)
    docs = _docs(texts)
    sp = spm.SentencePieceProcessor(model_file=path)
    got = [e.ids for e in Tokenizer.from_file(f"{d}/tokenizer.json").encode_batch(docs, add_special_tokens=False)]
    want = sp.encode(docs)
    bad = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    assert len(got) == len(want) and not bad, [docs[i][:60] for i in bad[:3]]
    with open(f"{d}/tokenizer_config.json", "rb") as f:
        assert orjson.loads(f.read())["eos_token"] == sp.id_to_piece(sp.eos_id()) == "</s>"
    assert hf_dir_for_megatron_fast(path) == d  # made once


def test_hf_directory_is_given_as_is(tmp_path):
    assert hf_dir_for_megatron_fast(str(tmp_path)) == str(tmp_path)

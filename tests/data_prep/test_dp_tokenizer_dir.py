"""A transformers tokenizer directory whose tokenizer.json is the whole tokenizer is read without transformers or
torch: the same ids, special tokens and encodings as AutoTokenizer gives; other directories still go through it."""

import json
import subprocess
import sys

import pytest
from tests.support.data_prep import REPO

from data_prep.steps.tokenizer_dir import load_plain_dir, plain_dir
from data_prep.steps.tokenizers import load_tokenizer



def _save(hf_bpe, d, **special):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(hf_bpe), **special).save_pretrained(str(d))
    return d


def _edit_config(d, **changes):
    p = d / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


@pytest.mark.unit
def test_plain_directory_equals_autotokenizer(hf_bpe, texts, tmp_path):
    from transformers import AutoTokenizer

    d = _save(hf_bpe, tmp_path / "tok", eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<pad>")
    _edit_config(d, eos_token={"__type": "AddedToken", "content": "<|endoftext|>", "special": True})
    assert plain_dir(str(d)) is not None
    auto = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    tok = load_tokenizer(str(d))
    assert (tok.info.eod_id, tok.info.bos_id, tok.info.pad_id) == (auto.eos_token_id, auto.bos_token_id,
                                                                  auto.pad_token_id)
    assert tok.info.vocab_size >= len(auto)
    sample = texts[:40]
    assert tok.encode_batch(sample) == [auto(t, add_special_tokens=False)["input_ids"] for t in sample]


@pytest.mark.unit
def test_directories_transformers_would_change_are_left_to_it(hf_bpe, tmp_path):
    d = _save(hf_bpe, tmp_path / "prefix", eos_token="<|endoftext|>")
    _edit_config(d, add_prefix_space=True)
    assert plain_dir(str(d)) is None
    d2 = _save(hf_bpe, tmp_path / "llama", eos_token="<|endoftext|>")
    _edit_config(d2, tokenizer_class="LlamaTokenizerFast")
    assert plain_dir(str(d2)) is None
    d3 = _save(hf_bpe, tmp_path / "new_token", eos_token="<|endoftext|>")
    _edit_config(d3, eos_token="<|not_in_tokenizer_json|>")  # transformers would add it as a new token
    assert plain_dir(str(d3)) is not None and load_plain_dir(str(d3)) is None
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(d3), local_files_only=True)
    assert load_tokenizer(str(d3)).info.eod_id == auto.eos_token_id  # loaded by transformers, as before


@pytest.mark.multiproc
def test_loading_a_plain_directory_imports_neither_transformers_nor_torch(hf_bpe, tmp_path):
    d = _save(hf_bpe, tmp_path / "tok", eos_token="<|endoftext|>")
    code = ("import sys; from data_prep.steps.tokenizers import load_tokenizer; t = load_tokenizer(sys.argv[1]); "
            "print(t.info.eod_id, 'transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(d)], cwd=REPO, capture_output=True, text=True, check=True)
    eod, transformers_loaded, torch_loaded = out.stdout.split()
    assert int(eod) >= 0 and transformers_loaded == "False" and torch_loaded == "False"

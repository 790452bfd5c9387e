"""Export parity: a transformers model exported from a training checkpoint computes our model's logits.

Our side is `recipes.model.layers.PlainDecoder` at TP = PP = 1 holding the checkpoint's weights as read (and TP-merged) by
`recipes.checkpoint.format.read`; the other side is `AutoModelForCausalLM.from_pretrained(export dir)`. Both fp32 on CPU; the
same math in a different order of additions differs by ~1e-6 here, so 1e-4 (the issue's bound) catches any wrong
mapping (a swapped q/k/v, gate/up, transpose or norm shows up as O(1e-1..1) differences).

Because both sides read the same merged weights, the merge itself is checked independently: a 2 x 2 x 2 run and a
1 x 1 x 1 run of the same recipe train to the same weights (layout-independent init, same data order; see
tests/training), so their exports must agree to float noise (observed ~1e-6 in logits after 6 steps; bound 1e-3).
A shard merged in the wrong order or along the wrong dimension changes logits by O(0.1).
"""
from __future__ import annotations

import pytest
import torch

from tests.support.plain_model import build_plain_model, greedy, logits
from recipes.checkpoint.format.read import read_full_state
from recipes.hf.export import export, main as export_main

pytestmark = pytest.mark.multiproc

TOL = 1e-4


@pytest.fixture(scope="module")
def exports(request, tmp_path_factory):
    """Export each run once: name -> (run, HF dir)."""
    out = {}
    for name in ("llama_222", "llama_111", "llama_z3", "gpt_22", "gpt_11"):
        run = request.getfixturevalue(name)
        hf_dir = tmp_path_factory.mktemp("hf") / name
        if name == "llama_222":  # once through the CLI, as a user runs it
            assert export_main(["--checkpoint", str(run.path), "--out", str(hf_dir), "--quiet",
                                "--config", run.config, *run.overrides]) == 0
        else:
            export(str(run.path), str(hf_dir), run.recipe())
        out[name] = (run, hf_dir)
    return out


def _hf(hf_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True).eval()


def _tokens(vocab, seed=0, shape=(2, 64)):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name,arch", [("llama_222", "LlamaForCausalLM"), ("llama_111", "LlamaForCausalLM"),
                                       ("llama_z3", "LlamaForCausalLM"),
                                       ("gpt_22", "GPT2LMHeadModel"), ("gpt_11", "GPT2LMHeadModel")])
def test_logits_match_our_model(exports, name, arch):
    run, hf_dir = exports[name]
    recipe = run.recipe()
    hf = _hf(hf_dir)
    assert type(hf).__name__ == arch
    assert hf.config.vocab_size == recipe.model.vocab_size  # padding stripped
    ours = build_plain_model(recipe, read_full_state(run.path, recipe.model).weights)
    tokens = _tokens(recipe.model.vocab_size)
    with torch.no_grad():
        theirs = hf(tokens).logits
    diff = (logits(ours, tokens, recipe.model.vocab_size) - theirs).abs().max().item()
    assert diff <= TOL, f"{name}: exported logits differ from ours by {diff:.2e}"


@pytest.mark.parametrize("big,small", [("llama_222", "llama_111"), ("llama_z3", "llama_111"), ("gpt_22", "gpt_11")])
def test_exports_of_different_layouts_agree(exports, big, small):
    a, b = _hf(exports[big][1]), _hf(exports[small][1])
    tokens = _tokens(a.config.vocab_size, seed=1)
    with torch.no_grad():
        diff = (a(tokens).logits - b(tokens).logits).abs().max().item()
        spread = a(tokens).logits.std().item()
    assert spread > 1e-2  # trained, not a constant output that would agree trivially
    assert diff <= 1e-3, f"{big} vs {small} exports differ by {diff:.2e}"


@pytest.mark.parametrize("name", ["llama_222", "gpt_22"])
def test_greedy_generation_matches(exports, corpus, name):
    import sentencepiece as spm

    run, hf_dir = exports[name]
    recipe = run.recipe()
    sp = spm.SentencePieceProcessor(model_file=corpus["sp_model"])
    prompt = torch.tensor([sp.encode("def __init__(self, name):\n        self.")])
    ours = greedy(build_plain_model(recipe, read_full_state(run.path, recipe.model).weights), prompt, 16,
                  recipe.model.vocab_size)
    theirs = _hf(hf_dir).generate(prompt, max_new_tokens=16, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert theirs.tolist() == ours.tolist()


def test_tokenizer_loads_offline_and_encodes_like_sentencepiece(exports, corpus):
    """Documents as the corpus has them (code: indentation, newlines, digits, non-ASCII via byte fallback) and the
    edge cases where a Metaspace pre-tokenizer would differ from sentencepiece's dummy prefix (leading spaces)."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    hf_dir = exports["llama_222"][1]
    tok = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    sp = spm.SentencePieceProcessor(model_file=corpus["sp_model"])
    samples = corpus["texts"][:20] + ["x = 12345  # ünïcode ✓ 漢字\n\tpass", "Hello world", " lead", "  two  spaces",
                                      "   ", "\n\nx", ""]
    for text in samples:
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text), text[:60]
        assert tok.decode(sp.encode(text)) == text, text[:60]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (sp.bos_id(), sp.eos_id(), sp.pad_id())
    import json

    gen = json.loads((hf_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == sp.eos_id()


def test_export_notes_document_masking(exports, llama_111, tmp_path):
    """transformers has no packed-sample masking: the export of a model.document_mask run says so in
    export_info.json (the weights and the HF config are those of any causal LM); other exports say false."""
    import json

    plain = json.loads((exports["llama_111"][1] / "export_info.json").read_text())
    assert plain["document_mask"] is False and "document_mask_note" not in plain
    recipe = llama_111.recipe()
    recipe.model.document_mask = True  # as the run's recipe.yaml would say had it trained with it
    export(str(llama_111.path), str(tmp_path / "hf"), recipe)
    info = json.loads((tmp_path / "hf" / "export_info.json").read_text())
    assert info["document_mask"] is True and info["recipe"]["model"]["document_mask"] is True
    assert "one document per sequence" in info["document_mask_note"]

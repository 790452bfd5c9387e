"""model.document_mask: a packed sample's loss equals the token-weighted loss of its documents run one by one.

Reference computed another way: each document of a packed sample (as megatron-core's GPTDataset cuts and positions it)
is fed alone through the same model with plain causal attention and positions 0..n-1; its per-token losses must equal
the packed run's. The flex_attention path (CUDA) is checked against the SDPA boolean mask (CPU) in eager mode.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from recipes.config.loading import recipe_from_dict
from recipes.parallel.layout import Layout
from tests.support.corpus import EOD

pytestmark = pytest.mark.unit

SHAPES = {
    "llama: rope, swiglu, GQA": dict(num_query_groups=2),
    "gpt: learned positions, gelu, tied": dict(position_embedding="learned", activation="gelu",
                                               normalization="layernorm", tied_embeddings=True, add_bias_linear=True),
}


def _recipe(manifest, **model):
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, vocab_size=320,
                seq_length=64, document_mask=True)
    base.update(model)
    return recipe_from_dict({"model": base, "training": {"global_batch": 4, "precision": "fp32"},
                             "data": {"manifests": [str(manifest)], "split": "90,10,0"}})


def _token_losses(model, inputs, labels):
    """Per-token cross-entropy [b, s] over the real vocabulary (TP = 1: the logits are the full padded vocabulary)."""
    logits = model.logits(inputs).transpose(0, 1).float()[..., :model.loss_fn.vocab_size]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none") \
        .view(labels.shape)


@pytest.mark.parametrize("name", list(SHAPES))
def test_packed_loss_equals_documents_one_by_one(name, short_doc_corpus, single_process_group, tmp_path):
    from recipes.model.layers import PlainDecoder, document_ids
    from recipes.train.data import MicroBatches, build_datasets

    recipe = _recipe(short_doc_corpus, **SHAPES[name])
    train, _ = build_datasets(recipe, 8, 4, str(tmp_path / "cache"))
    (tokens, positions), (labels, loss_mask) = next(MicroBatches(
        train, micro_batch=4, grad_accum=1, dp_rank=0, dp_size=1, device=torch.device("cpu"),
        positions=True).step(0))

    # Documents from the tokens alone: a new one starts after each EOD (and at the start of the sample).
    after_eod = torch.cat([torch.ones_like(tokens[:, :1]), (tokens[:, :-1] == EOD).long()], dim=1)
    assert torch.equal(document_ids(positions), after_eod.cumsum(1)), "GPTDataset positions do not restart at EOD"
    assert (after_eod.sum(1) >= 2).all(), "the test needs packed samples holding several documents"

    torch.manual_seed(0)
    model = PlainDecoder(recipe, Layout()).eval()
    with torch.no_grad():
        packed = _token_losses(model, (tokens, positions), labels)
        one_by_one = torch.empty_like(packed)
        for b in range(tokens.shape[0]):
            docs = document_ids(positions[b:b + 1])[0]
            for d in docs.unique():
                idx = (docs == d).nonzero().flatten()  # contiguous
                one_by_one[b, idx] = _token_losses(model, tokens[b:b + 1, idx], labels[b:b + 1, idx])[0]
        unmasked = _token_losses(model, tokens, labels)
        loss = model((tokens, positions), labels, loss_mask)

    torch.testing.assert_close(packed, one_by_one, rtol=1e-5, atol=1e-5)
    weighted = (one_by_one * loss_mask).sum() / loss_mask.sum()  # token-weighted over documents
    torch.testing.assert_close(loss, weighted, rtol=1e-6, atol=1e-6)
    # ... and the mask matters: attending across documents changes the losses after the first document.
    assert (unmasked - packed).abs().max() > 1e-3


def test_flex_attention_path_equals_sdpa_mask(single_process_group):
    """The CUDA path (flex_attention with a BlockMask built from document ids) against the CPU path (SDPA with the
    boolean block-diagonal causal mask), GQA, ragged documents; flex run eagerly here (its reference kernel)."""
    from recipes.model.layers import document_attention, document_causal_mask, flex_document_attention

    torch.manual_seed(0)
    docs = torch.tensor([[1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 4, 5] + [5] * 20,
                         [1] * 30 + [2, 2]])
    q = torch.randn(2, 4, 32, 16)
    k, v = torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    with warnings.catch_warnings():  # torch's "flex_attention called without torch.compile" notice (once a process)
        warnings.simplefilter("ignore")
        flex = flex_document_attention(q, k, v, docs, compiled=False)
    sdpa = document_attention(q, k, v, docs)  # CPU tensors: the SDPA path
    torch.testing.assert_close(flex, sdpa, rtol=1e-5, atol=1e-5)
    mask = document_causal_mask(docs)
    assert mask[0, 0, 3, 2].item() is False and mask[0, 0, 4, 3].item() is True and mask[0, 0, 3, 4].item() is False

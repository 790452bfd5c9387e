"""Context parallelism, the parts that need no second process: the chunk split and its load balance, the attention of
one CP rank's chunks over the gathered sequence (CPU mask path, and the CUDA paths run on CPU tensors) against plain
full-sequence attention, and the layout rules / DeepSpeed view of the CP axis.

References computed another way: full-sequence causal (or document-causal) attention over all s positions, whose rows
at a rank's positions must equal what that rank computes from its own queries and the gathered keys/values."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from recipes.config.loading import load_recipe
from recipes.model.context import chunk_positions
from recipes.model.context_attention import (chunked_causal_attention, context_mask, flex_context_attention)
from recipes.model.layers import document_attention, document_ids
from recipes.parallel.ds_config import build_ds_config
from recipes.parallel.layout import Layout, resolve_layout

pytestmark = pytest.mark.unit

RECIPE = "configs/runs/tiny-cpu.yaml"


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_chunks_cover_the_sequence_once_and_balance_causal_work(cp):
    s = 2 * cp * 5
    held = [chunk_positions(s, cp, r, torch.device("cpu")) for r in range(cp)]
    assert sorted(torch.cat(held).tolist()) == list(range(s))
    c = s // (2 * cp)
    for r, pos in enumerate(held):  # chunks r and 2cp-1-r, in that order
        assert pos.tolist() == list(range(r * c, (r + 1) * c)) + list(range((2 * cp - 1 - r) * c, (2 * cp - r) * c))
    work = [int((pos[:, None] >= torch.arange(s)[None, :]).sum()) for pos in held]  # causal (query, key) pairs
    assert len(set(work)) == 1, work
    with pytest.raises(ValueError, match="divisible by 2 x cp"):
        chunk_positions(s + 1, cp, 0, torch.device("cpu"))


def _qkv(s=32, b=2, heads=4, groups=2, d=16):
    torch.manual_seed(0)
    return torch.randn(b, heads, s, d), torch.randn(b, groups, s, d), torch.randn(b, groups, s, d)


DOCS = torch.tensor([[1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 4, 5] + [5] * 20,
                     [1] * 13 + [2] * 19])


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("documents", [False, True])
def test_rank_attention_equals_rows_of_full_attention(cp, documents):
    """Each CP rank's queries over all keys (the mask the CPU path builds) give the full attention's rows at its
    positions; GQA (4 heads, 2 groups), ragged documents crossing chunk boundaries."""
    q, k, v = _qkv()
    s = q.shape[2]
    docs = DOCS if documents else None
    full = document_attention(q, k, v, docs) if documents else F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True)
    for rank in range(cp):
        pos = chunk_positions(s, cp, rank, q.device)
        mask = context_mask(pos, s, docs)
        got = F.scaled_dot_product_attention(q[:, :, pos], k, v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(got, full[:, :, pos], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cp", [2, 4])
def test_cuda_causal_path_two_sdpa_calls_equals_full_attention(cp):
    """The CUDA path without documents: one lower-right-causal SDPA call per local chunk over its key prefix."""
    q, k, v = _qkv()
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    for rank in range(cp):
        pos = chunk_positions(q.shape[2], cp, rank, q.device)
        got = chunked_causal_attention(q[:, :, pos], k, v, cp, rank)
        torch.testing.assert_close(got, full[:, :, pos], rtol=1e-5, atol=1e-5)


def test_cuda_document_path_flex_equals_full_document_attention():
    """The CUDA path with documents: flex_attention over a block mask of the local queries' global positions (run
    eagerly here, torch's reference kernel)."""
    q, k, v = _qkv()
    full = document_attention(q, k, v, DOCS)
    cp = 2
    for rank in range(cp):
        pos = chunk_positions(q.shape[2], cp, rank, q.device)
        docs = DOCS.clone()  # a fresh micro-batch per rank: the block mask is cached on the tensor
        with warnings.catch_warnings():  # torch's "flex_attention called without torch.compile" notice
            warnings.simplefilter("ignore")
            got = flex_context_attention(q[:, :, pos], k, v, pos, docs, compiled=False)
        torch.testing.assert_close(got, full[:, :, pos], rtol=1e-5, atol=1e-5)


def test_document_ids_of_the_whole_sequence_follow_the_chunks():
    """Document ids come from the whole sequence's position ids (a document can start in another rank's chunk)."""
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]])
    docs = document_ids(positions)
    pos = chunk_positions(8, 2, 1, torch.device("cpu"))  # chunks 1 and 2: positions 2, 3, 4, 5
    mask = context_mask(pos, 8, docs)[0, 0]
    assert mask[0].tolist() == [True, True, True, False, False, False, False, False]  # pos 2: doc 1 = 0..2
    assert mask[2].tolist() == [False, False, False, True, True, False, False, False]  # pos 4: doc 2 = 3..4


def test_layout_world_order_and_deepspeed_view():
    recipe = load_recipe(RECIPE, ["parallel.tp=2", "parallel.cp=2", "parallel.pp=2", "model.seq_length=64"])
    lay, problems = resolve_layout(recipe, 16)
    assert not problems and (lay.tp, lay.cp, lay.pp, lay.dp) == (2, 2, 2, 2) and lay.world_size == 16
    assert lay.data_axis == 4
    # tp fastest, then cp, then dp, then pp (megatron-core's tp-cp-ep-dp-pp)
    assert [lay.coords(r) for r in (0, 1, 2, 4, 8)] == [
        dict(tp=0, cp=0, dp=0, pp=0), dict(tp=1, cp=0, dp=0, pp=0), dict(tp=0, cp=1, dp=0, pp=0),
        dict(tp=0, cp=0, dp=1, pp=0), dict(tp=0, cp=0, dp=0, pp=1)]
    assert all(lay.rank(**lay.coords(r)) == r for r in range(16))
    assert "CP=2" in lay.describe()
    ds = build_ds_config(recipe, lay, "cpu")  # DeepSpeed's batch counts each of its DP x CP data ranks
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 4
    assert ds["gradient_accumulation_steps"] == recipe.training.global_batch // (lay.micro_batch * lay.dp)


@pytest.mark.parametrize("overrides,world,field,text", [
    (["parallel.cp=3"], 3, "parallel.cp", "not divisible by 2 x parallel.cp = 6"),
    (["parallel.cp=2"], 3, "parallel.tp", "not divisible by parallel.tp x cp x pp = 1 x 2 x 1"),
    (["parallel.cp=2", "parallel.dp=2"], 8, "parallel.dp", "tp x cp x pp x dp = 1 x 2 x 1 x 2 = 4"),
    (["parallel.cp=2", "parallel.tp=4", "parallel.sequence_parallel=true", "model.seq_length=36",
      "model.num_query_groups=4"], 8, "parallel.sequence_parallel", "model.seq_length / cp = 18 tokens over "
     "parallel.tp=4"),
])
def test_layout_refuses_what_cp_cannot_split(overrides, world, field, text):
    recipe = load_recipe(RECIPE, overrides)
    _, problems = resolve_layout(recipe, world)
    assert any(p.field == field and text in str(p) for p in problems), [str(p) for p in problems]


def test_cp_one_keeps_the_layout_as_it_was():
    lay = Layout(tp=2, pp=2, dp=2)
    assert lay.world_size == 8 and lay.data_axis == 2 and "CP" not in lay.describe()
    assert lay.coords(5) == dict(tp=1, cp=0, dp=0, pp=1) and lay.rank(tp=1, dp=0, pp=1) == 5

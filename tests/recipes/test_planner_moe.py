"""The planner prices mixtures of experts (issue 24, item 4): expert memory divided by EP x expert TP, the dispatch /
combine all-to-alls against a hand calculation, EP chosen where the experts would not fit without it and kept inside
a node where it fits there, and the explanation says why this EP."""
from dataclasses import replace

import pytest

from recipes.config.schema import ClusterConfig, ModelConfig
from recipes.model.shape import moe_layer_parameters
from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions
from recipes.planner.cost import estimate, params_per_gpu
from recipes.planner.search import candidate_layouts, plan_layouts
from recipes.planner.experts import all_to_all_seconds
from recipes.planner import explain as ex

pytestmark = pytest.mark.unit


def cluster(nodes: int, memory_gb: float = 24) -> ClusterConfig:
    return ClusterConfig(nodes=nodes, gpus_per_node=8, gpu="X", gpu_memory_gb=memory_gb, peak_tflops=989,
                         intra_node_gbps=900, inter_node_gbps=400)


# Two layers, 64 experts of 4096 (top-2) at h 4096: 3.2B expert parameters, 0.3B of the rest.
MODEL = ModelConfig(num_layers=2, hidden_size=4096, num_attention_heads=16, num_query_groups=4, ffn_hidden_size=16384,
                    vocab_size=32000, seq_length=4096, activation="swiglu", normalization="rmsnorm",
                    position_embedding="rope", add_bias_linear=False,
                    moe=dict(num_experts=64, top_k=2, ffn_hidden_size=4096))


def test_expert_memory_divides_by_ep_and_expert_tp():
    experts = 2 * moe_layer_parameters(MODEL)[2]
    assert experts == 2 * 64 * 3 * 4096 * 4096
    for tp, ep in ((1, 2), (1, 8), (2, 4)):
        dropped = params_per_gpu(MODEL, tp, 1, 1) - params_per_gpu(MODEL, tp, 1, ep)
        assert dropped == pytest.approx(experts / tp * (1 - 1 / ep))


def test_all_to_all_priced_against_a_hand_calculation():
    """ep_comm of one micro-batch, by hand: each rank sends its 4096 tokens x top-2 x h 4096 x 2 bytes, x 1.2 (the
    assumed imbalance) per all-to-all; 4 all-to-alls per MoE layer (dispatch + combine, forward + backward), 2 layers."""
    nbytes = 4096 * 2 * 4096 * 2 * 1.2  # 80,530,636.8 bytes
    nvlink = 900e9 * 0.4  # intra_node_gbps x intra_link_efficiency
    nic = 400e9 * 0.8 / 8  # a GPU's share of its node's NICs: inter_node_gbps x inter_link_efficiency / 8 GPUs
    inside = nbytes * 7 / 8 / nvlink + 2e-6  # EP=8 in one node: 7/8 of the bytes leave the GPU, over NVLink
    across = max(nbytes * 7 / 16 / nvlink, nbytes * 8 / 16 / nic) + 5e-6  # EP=16 over 2 nodes: half go over IB
    assert inside == pytest.approx(1.9773e-4, rel=1e-4) and across == pytest.approx(1.01163e-3, rel=1e-4)
    a = Assumptions(moe_load_imbalance=1.2)  # the imbalance is given, not the default (1.0: balanced)
    assert all_to_all_seconds(nbytes, 8, 8, cluster(1), a) == pytest.approx(inside, rel=1e-12)
    assert all_to_all_seconds(nbytes, 16, 8, cluster(2), a) == pytest.approx(across, rel=1e-12)
    for nodes, ep, one in ((1, 8, inside), (2, 16, across)):
        lay = Layout(tp=1, pp=1, dp=8 * nodes, ep=ep, zero_stage=1)
        e = estimate(MODEL, cluster(nodes), lay, global_batch=8 * nodes, assume=a)  # one micro-batch per step
        assert e.micro_batches == 1
        assert e.time_s["ep_comm"] == pytest.approx(2 * 4 * one, rel=1e-9)
    assert estimate(MODEL, cluster(1), Layout(dp=8, ep=1, zero_stage=1), 8).time_s["ep_comm"] == 0.0


def test_search_tries_ep_for_experts_only():
    moe = {lay.ep for lay in candidate_layouts(MODEL, cluster(1), 64)}
    assert moe == {1, 2, 4, 8}
    dense = MODEL.model_copy(update={"moe": None})
    assert {lay.ep for lay in candidate_layouts(dense, cluster(1), 64)} == {1}


def plan(nodes: int, batch: int) -> ex.Plan:
    ests = plan_layouts(MODEL, cluster(nodes), batch)
    recipe = type("R", (), {})()
    recipe.model, recipe.cluster = MODEL, cluster(nodes)
    recipe.training = type("T", (), {"global_batch": batch, "precision": "bf16"})()
    return ex.Plan(recipe=recipe, ests=ests, rec=ex.recommend(ests))


def test_ep_chosen_where_the_experts_would_not_fit_without_it():
    p = plan(1, 64)
    lay = p.rec.layout
    assert lay.ep > 1
    without = estimate(MODEL, cluster(1), replace(lay, ep=1), 64)
    assert not without.fits_with_headroom  # the same layout holding every expert is over the budget
    assert without.memory_gib["params"] > p.rec.memory_gib["params"]
    text = ex.expert_parallel(p)
    assert f"EP={lay.ep} gives each GPU {64 // lay.ep} of the 64 experts" in text
    lower = max(d for d in (1, 2, 4, 8) if d < lay.ep)
    assert f"EP={lower} would need" in text and "over the" in text


def test_ep_kept_inside_a_node_when_it_fits_there():
    p = plan(2, 128)
    lay = p.rec.layout
    assert 1 < lay.ep and lay.ep * lay.tp <= 8  # one node's GPUs
    across = estimate(MODEL, cluster(2), replace(lay, ep=16), 128)
    assert across.fits_with_headroom  # it would fit, but its all-to-alls cross InfiniBand
    diff = across.terms.minus(p.rec.terms)
    assert max(diff, key=diff.get) == "ep_comm" and across.tokens_per_s < p.rec.tokens_per_s
    text = ex.expert_parallel(p)
    assert "inside a node, on NVLink" in text and "Load imbalance: the busiest EP rank gets 1x" in text
    assert "(the default: published MoE throughput is measured with the tokens force-balanced" in text
    assert "EP=16 runs at" in text and "all-to-alls" in text.split("EP=16 runs at")[1]


def test_no_fit_names_the_zero_stage_actually_searched_for_experts():
    """ZeRO-3 is refused with experts, so the search stops at ZeRO-2: the no-fit sentence says so, not ZeRO-3."""
    from recipes.planner.search import what_would_fit

    tiny = cluster(1, memory_gb=1)
    ests = plan_layouts(MODEL, tiny, 64)
    assert ests and not any(e.fits for e in ests) and max(e.layout.zero_stage for e in ests) == 2
    msg = what_would_fit(MODEL, tiny, 64, max_nodes=2)
    assert "ZeRO-2, full recompute" in msg and "ZeRO-3" not in msg

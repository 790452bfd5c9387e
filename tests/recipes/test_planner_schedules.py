"""Pipeline schedules in the planner (issue 40, item 4): each schedule's bubble, activations in flight and sends by
its formula, computed here by hand from the priced micro-batch; the search prices them, the plan explains the choice
from those terms and `--write-recipe` writes it. Also the memory bounds (Korthikanti's count and the lean one) and
the one ring formula the cost model calls (issue 46)."""
from dataclasses import replace

import pytest
import yaml

from recipes.config.schema import ClusterConfig, ModelConfig
from recipes.parallel.layout import Layout
from recipes.planner import cli, links
from recipes.planner import explain as ex
from recipes.planner.assumptions import Assumptions
from recipes.planner.compute import compute_efficiency, micro_batch_seconds
from recipes.planner.cost import estimate
from recipes.planner.memory import activation_bytes_per_layer
from recipes.planner.pipeline import in_flight, messages, schedule_options
from recipes.planner.search import candidate_layouts

pytestmark = pytest.mark.unit

H100 = ClusterConfig(nodes=4, gpus_per_node=8, gpu="H100-80GB", gpu_memory_gb=80, peak_tflops=989,
                     intra_node_gbps=900, inter_node_gbps=400)
MODEL = ModelConfig(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                    vocab_size=128256, seq_length=4096, activation="swiglu", normalization="rmsnorm",
                    position_embedding="rope", tied_embeddings=False, add_bias_linear=False)
BASE = Layout(tp=2, pp=4, dp=4, zero_stage=1, sequence_parallel=True)
BATCH = 64  # m = 16 micro-batches per DP rank


def priced(layout: Layout):
    return estimate(MODEL, H100, layout, BATCH)


def slot_and_weight_grad(layout: Layout) -> tuple[float, float]:
    """One micro-batch's time on the slowest stage (what the bubble is made of) and its weight-gradient GEMMs."""
    e = priced(layout)
    t = e.time_s
    m = e.micro_batches
    slot = sum(t[k] for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "imbalance")) / m
    times = micro_batch_seconds(MODEL, H100, layout, layout, compute_efficiency(MODEL, layout, Assumptions()),
                                Assumptions())
    return slot, times.weight_grad


def test_each_schedule_s_bubble_is_its_formula():
    p, m = 4, 16
    one = priced(BASE)
    slot, w = slot_and_weight_grad(BASE)
    assert one.time_s["bubble"] == pytest.approx((p - 1) * slot)  # 1F1B: (p-1) slots
    assert one.bubble_fraction == pytest.approx((p - 1) / m)
    inter = priced(replace(BASE, schedule="interleaved_1f1b", vpp=4))
    assert inter.time_s["bubble"] == pytest.approx((p - 1) * slot / 4)
    assert inter.bubble_fraction == pytest.approx((p - 1) / (4 * m))
    for v in (1, 2):
        zb = priced(replace(BASE, schedule="zero_bubble", vpp=v))
        assert zb.time_s["bubble"] == pytest.approx((p - 1) * (slot - 2 * w) / v)  # ZB-H1: (p-1)(F+B-W) per chunk
    # W is a third of the GEMMs and attention has none: the bubble stays above a third of 1F1B's
    assert (slot - 2 * w) > slot / 3
    assert w == pytest.approx(slot / 3, rel=0.25)


def test_activations_in_flight_and_sends_per_schedule():
    p, m = 4, 16
    assert in_flight(BASE, m) == p
    inter = replace(BASE, schedule="interleaved_1f1b", vpp=4)
    assert in_flight(inter, m) == pytest.approx(p * (1 + (p - 1) / (p * 4)))  # Korthikanti et al., Sec. 4.2
    assert in_flight(replace(BASE, schedule="zero_bubble", vpp=4), m) == p  # ZB-H1: 1F1B's peak
    assert in_flight(BASE, 2) == 2  # fewer micro-batches than stages: all of them
    assert messages(BASE, m) == 2 * (m + p - 2) and messages(inter, m) == 2 * (4 * m + p - 2)
    one, four = priced(BASE), priced(inter)
    assert four.memory_gib["activations"] > one.memory_gib["activations"]
    assert four.time_s["pp_comm"] == pytest.approx(one.time_s["pp_comm"] * (4 * m + p - 2) / (m + p - 2))


def test_the_search_prices_every_schedule_and_respects_the_layout_rules():
    assert schedule_options(MODEL, 1) == [("1f1b", 1)]
    assert set(schedule_options(MODEL, 4)) == {("1f1b", 1), ("zero_bubble", 1), ("interleaved_1f1b", 2),
                                               ("interleaved_1f1b", 8), ("zero_bubble", 2), ("zero_bubble", 8)}
    lays = candidate_layouts(MODEL, H100, BATCH)
    assert {(l.schedule, l.vpp) for l in lays if l.pp == 4} == set(schedule_options(MODEL, 4))
    for lay in lays:
        assert not lay.problems(MODEL, BATCH)
        assert lay.pp == 1 or lay.zero_stage <= 1  # ZeRO-2/3 with PP stays refused (recipes/parallel/layout.py)
        assert lay.pp * lay.vpp <= MODEL.num_layers


def test_the_plan_explains_the_schedule_from_its_priced_terms(tmp_path, capsys):
    argv = ["models/llama-70b", "--cluster", "clusters/h100-80gb", "--nodes", "16", "--tokens", "2e12"]
    plan = cli.make_plan(cli.build_parser().parse_intermixed_args(argv))
    lay, rec = plan.rec.layout, plan.rec
    assert lay.pp > 1
    text = ex.pipeline(plan)
    assert f"the bubble costs {rec.time_s['bubble']:.2f} s ({ex.bubble_words(rec)})" in text
    for sched, v in schedule_options(plan.model, lay.pp):
        if (sched, v) == (lay.schedule, lay.vpp):
            continue
        twin = estimate(plan.model, plan.cluster, replace(lay, schedule=sched, vpp=v), 1024, assume=plan.assume)
        d = twin.terms.minus(rec.terms)
        assert f"bubble {d['bubble']:+.2f} s, sends {d['pp_comm']:+.2f} s" in text, (sched, v)
    out = tmp_path / "r.yaml"
    assert cli.main([*argv, "--write-recipe", str(out)]) == 0
    written = yaml.safe_load(out.read_text())["parallel"]
    assert written.get("pipeline_schedule", "auto") == ("auto" if lay.schedule == "1f1b" else lay.schedule)
    assert written.get("vpp", 1) == lay.vpp


def test_the_lean_activation_count_drops_what_element_wise_ops_remake():
    """Korthikanti's TP + SP count per layer is sbh (34/t) for a GPT layer; the lean count keeps the norm inputs
    but not their outputs (4 sbh) and not the activation function's output (the fc2 input, 2 f sbh / h)."""
    s, b, h, a, t = 2048, 1, 4096, 32, 4
    full = activation_bytes_per_layer(s, b, h, a, t, True, flash_attention=True, dropout=True)
    lean = activation_bytes_per_layer(s, b, h, a, t, True, flash_attention=True, dropout=True, lean=True)
    assert full == pytest.approx(s * b * h * 34 / t)
    assert full - lean == pytest.approx(s * b * h * (4 + 2 * 4) / t)
    lay = Layout(tp=8, pp=16, dp=64, zero_stage=1, sequence_parallel=True)
    e = priced(replace(lay, dp=1))
    assert e.memory_gib["total_lean"] < e.memory_gib["total"]


def test_the_cost_model_calls_the_ring_formula_the_tests_check(monkeypatch):
    """One copy of the ring collective (issue 46): every Link prices through `links.ring_seconds`."""
    calls = []
    real = links.ring_seconds

    def spy(*args, **kwargs):
        calls.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(links, "ring_seconds", spy)
    e = estimate(MODEL, H100, BASE, BATCH)
    assert e.time_s["tp_comm"] > 0 and e.time_s["dp_comm"] > 0
    assert {"all_gather", "reduce_scatter", "all_reduce"} <= set(calls)
    link = links.Link(n=8, bus_gbps=100.0, latency_s=1e-5)
    assert link.seconds(1e9, "all_reduce", 3) == real(1e9, 8, 100.0, "all_reduce", step_latency_s=1e-5, calls=3)

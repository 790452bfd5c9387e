"""The GPU fast path's CPU-checkable half: the DeepSpeed JSON a GPU recipe gets and the planner's assumptions come from
one function and agree; the planner lists no layout twice; the recipe fields are validated; the fused non-finite check
says exactly what the per-tensor loop said; megatron-core's fused code path computes what the unfused one does."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from recipes.parallel.ds_config import build_ds_config, zero_comm_settings
from recipes.model.fast_path import any_non_finite, attention_problem, fused_config_kwargs, sdpa_backend
from recipes.parallel.layout import Layout
from recipes.config.loading import RecipeError, load_recipe
from recipes.planner.cost import Assumptions, estimate
from recipes.planner.search import plan_layouts

pytestmark = pytest.mark.unit

GPU_RECIPE = "configs/runs/bench-gpt-1.3b-1gpu.yaml"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_gpu_recipe_json_has_overlap_on_and_planner_read_the_same_values(stage):
    recipe = load_recipe(GPU_RECIPE, [f"parallel.zero_stage={stage}"])
    assert recipe.cluster.device == "cuda"
    zero = build_ds_config(recipe, Layout.from_recipe(recipe))["zero_optimization"]
    assert zero["overlap_comm"] is True and zero["contiguous_gradients"] is True
    a = Assumptions()  # what every plan prices
    assert a.overlap_comm == zero["overlap_comm"]
    assert a.contiguous_gradients == zero["contiguous_gradients"]
    assert a.bucket_elements == zero["reduce_bucket_size"] == zero["allgather_bucket_size"]
    if stage == 3:
        assert a.zero3_bucket_elements == zero["stage3_prefetch_bucket_size"]


def test_cpu_runs_keep_overlap_off_and_the_cpu_assumptions_say_so():
    recipe = load_recipe("configs/runs/tiny-cpu.yaml", [])
    lay = Layout.from_recipe(recipe, 1)
    assert build_ds_config(recipe, lay, "cpu")["zero_optimization"]["overlap_comm"] is False
    # A GPU recipe on a machine without CUDA: the engine passes the device it got, so the JSON follows the device.
    gpu = load_recipe(GPU_RECIPE, [])
    assert build_ds_config(gpu, Layout.from_recipe(gpu), "cpu")["zero_optimization"]["overlap_comm"] is False
    assert Assumptions.for_device("cpu").overlap_comm is False
    assert Assumptions.for_device("cuda") == Assumptions()
    assert zero_comm_settings(0, "cuda") == {}  # ZeRO-0 has no zero_optimization tuning to price


def test_overlap_doubles_the_reduce_bucket_the_planner_prices():
    recipe = load_recipe(GPU_RECIPE, [])
    m, cl, b = recipe.model, recipe.cluster, recipe.training.global_batch
    lay = Layout.from_recipe(recipe)
    on = estimate(m, cl, lay, b, assume=Assumptions())
    off = estimate(m, cl, lay, b, assume=Assumptions.for_device("cpu"))
    bucket_gib = Assumptions().bucket_elements * 2 / 2**30  # bf16 elements
    assert on.memory_gib["buffers"] - off.memory_gib["buffers"] == pytest.approx(bucket_gib)


def _cluster_recipe():
    return load_recipe("configs/examples/c-llama-7b-one-node.yaml", [])


def test_planner_lists_no_layout_twice():
    recipe = _cluster_recipe()
    m, cl, b = recipe.model, recipe.cluster, recipe.training.global_batch
    ests = plan_layouts(m, cl, b)
    assert len(ests) > 20
    # selective recompute with flash attention runs as no recompute: it must not appear as a layout of its own
    assert not [e for e in ests if e.layout.recompute == "selective"]
    figures = [(e.layout.tp, e.layout.pp, e.layout.dp, e.layout.micro_batch, tuple(sorted(e.memory_gib.items())),
                tuple(sorted(e.time_s.items()))) for e in ests]
    assert len(set(figures)) == len(figures)
    # The report's memory plot (top 10) therefore has no two identical bars either.
    bars = [tuple(sorted(e.memory_gib.items())) + (e.layout.describe(),) for e in ests[:10]]
    assert len(set(bars)) == 10
    # The same layout with recompute=selective, priced on its own, costs what the listed `none` layout costs.
    none = ests[0].layout
    sel = estimate(m, cl, replace(none, recompute="selective"), b)
    assert sel.time_s == ests[0].time_s and sel.memory_gib == ests[0].memory_gib


def test_selective_is_searched_where_it_changes_something():
    recipe = _cluster_recipe()
    m, cl, b = recipe.model, recipe.cluster, recipe.training.global_batch
    no_flash = Assumptions(flash_attention=False)
    ests = plan_layouts(m, cl, b, assume=no_flash)
    sel = [e for e in ests if e.layout.recompute == "selective"]
    assert sel
    none = estimate(m, cl, replace(sel[0].layout, recompute="none"), b, assume=no_flash)
    assert sel[0].memory_gib["activations"] < none.memory_gib["activations"]


def test_fast_path_recipe_fields_are_validated():
    r = load_recipe(GPU_RECIPE, ["training.allow_math_attention=true", "training.compile_decoder_layers=true"])
    assert r.training.allow_math_attention and r.training.compile_decoder_layers
    assert not load_recipe(GPU_RECIPE, []).training.allow_math_attention  # refusing the math kernel is the default
    with pytest.raises(RecipeError, match="allow_math_attention"):
        load_recipe(GPU_RECIPE, ["training.allow_math_attention=maybe"])


def test_math_attention_is_refused_for_bf16_unless_allowed():
    msg = attention_problem("math", 128, torch.bfloat16, allow_math=False)
    assert "training.allow_math_attention=true" in msg and "head dim 128" in msg
    assert attention_problem("math", 128, torch.bfloat16, allow_math=True) is None
    assert attention_problem("flash", 128, torch.bfloat16, allow_math=False) is None
    assert attention_problem("math", 128, torch.float32, allow_math=False) is None  # fp32 has no fused kernel
    assert attention_problem("math", 512, torch.bfloat16, allow_math=False) is None  # nothing else exists there
    # torch's own choice is read, not guessed: forbidding every fused kernel makes it say math.
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        assert sdpa_backend(64, 4, 2, 128, torch.float32, torch.device("cpu")) == "math"


def _per_tensor_loop(tensors) -> bool:  # what engine.GuardedAdamW did before
    return any(not torch.isfinite(t).all() for t in tensors)


@pytest.mark.parametrize("case", ["finite", "huge", "nan", "inf_bf16", "neg_inf", "mixed", "empty"])
def test_fused_non_finite_check_says_what_the_loop_said(case):
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(37, 5, generator=g), torch.randn(11, generator=g).bfloat16(), torch.randn(3, 3, 2)]
    if case == "huge":  # finite but squaring overflows fp32: a 2-norm would call it inf
        tensors[0][3, 1] = 3e38
    elif case == "nan":
        tensors[2][1, 2, 0] = float("nan")
    elif case == "inf_bf16":
        tensors[1][4] = float("inf")
    elif case == "neg_inf":
        tensors[0][0, 0] = -float("inf")
    elif case == "mixed":
        tensors[0][0, 0], tensors[1][0] = float("nan"), float("inf")
    elif case == "empty":
        tensors = []
    flag = any_non_finite(tensors, torch.device("cpu"))
    assert flag.shape == (1,) and flag.dtype == torch.float32
    assert bool(flag.item()) == _per_tensor_loop(tensors) == (case not in ("finite", "huge", "empty"))


@pytest.mark.parametrize("preset", ["tiny", "tiny-gpt"])
def test_fused_megatron_path_computes_what_the_unfused_one_does(preset, tp1_group):
    """The TransformerConfig the fast path builds is accepted by megatron-core and its fused code path (bias+GeLU or
    SwiGLU, bias-dropout-add) gives the unfused layer's output and gradients. Run eagerly here (dynamo disabled: CPU
    compilation would take minutes); tests/gpu runs the compiled kernels."""
    import torch._dynamo

    from recipes.model.layers import DecoderLayerPipe, transformer_config

    m = load_recipe(f"models/{preset}", ["training.global_batch=8"]).model
    out = {}
    for fused in (False, True):
        cfg = transformer_config(m, 1, fused=fused)
        assert cfg.bias_dropout_fusion == fused
        assert cfg.bias_activation_fusion == (fused and (m.activation == "swiglu" or m.add_bias_linear))
        layer = DecoderLayerPipe(cfg, m, 1, seed=7)
        x = torch.randn(m.seq_length, 2, m.hidden_size, generator=torch.Generator().manual_seed(1),
                        requires_grad=True)
        with torch._dynamo.config.patch(disable=True):
            y = layer(x)
            y.square().mean().backward()
        out[fused] = (y.detach(), x.grad, [p.grad for p in layer.parameters()])
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-4, atol=1e-6)
    for a, b in zip(out[True][2], out[False][2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_fusion_kwargs_follow_the_model_shape():
    llama = load_recipe("models/tiny", ["training.global_batch=8"]).model
    assert fused_config_kwargs(llama)["activation_func"] is torch.nn.functional.silu
    gpt = load_recipe("models/tiny-gpt", ["training.global_batch=8"]).model
    assert fused_config_kwargs(gpt)["activation_func"] is torch.nn.functional.gelu  # tanh-approximate when fused
    no_bias = gpt.model_copy(update={"add_bias_linear": False})
    assert "bias_activation_fusion" not in fused_config_kwargs(no_bias)  # megatron-core refuses bias-free GeLU fusion


@pytest.fixture
def tp1_group():
    """A world of one and TP=1 megatron state (the layer's TP linears ask for their group); reused when another
    in-process test already made one (a second init_process_group would fail)."""
    from tests.support.plain_model import init_single_process

    init_single_process()
    yield


def test_plan_ranks_a_recipe_layout_that_is_listed_as_its_same_cost_twin(capsys):
    from recipes.planner.cli import main

    assert main(["configs/examples/c-llama-7b-one-node.yaml", "parallel.recompute=selective", "parallel.dp=8",
                 "parallel.micro_batch=1", "parallel.zero_stage=1"]) == 0
    out = capsys.readouterr().out
    own = next(line for line in out.splitlines() if "The recipe's own layout" in line)
    # listed as the `none` layout: the table row with TP 1, PP 1 (no schedule), DP 8, ZeRO 1, micro-batch 1,
    # recompute none
    row = next(line.split()[0] for line in out.splitlines() if line.split()[1:9] == "1 1 - 8 1 1 none n".split())
    assert "recompute=selective" in own and f"ranks {row} of" in own, own

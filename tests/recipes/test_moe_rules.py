"""Every impossible model.moe / parallel.ep combination is refused before anything starts, with the field and the fix
(schema validators for the model alone, Layout.problems for the layout); the MoE presets count as released."""
import pytest

from recipes.config.loading import RecipeError, load_raw, deep_merge, recipe_from_dict
from recipes.model.shape import count_parameters
from recipes.planner.validation import validate
from tests.recipes.test_validation_rules import with_sections

pytestmark = pytest.mark.unit


def make(moe: dict | None = None, **sections):
    data = {
        "model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
                  "ffn_hidden_size": 128, "vocab_size": 256, "seq_length": 64,
                  "moe": {"num_experts": 4, "top_k": 2, **(moe or {})}},
        "parallel": {"tp": 1, "pp": 1, "zero_stage": 1, "micro_batch": 1},
        "training": {"global_batch": 8},
        "cluster": {"nodes": 1, "gpus_per_node": 8, "device": "cpu", "backend": "gloo", "gpu_memory_gb": 16},
    }
    return recipe_from_dict(with_sections(data, sections))


@pytest.mark.parametrize("moe,model,expect", [
    (dict(top_k=5), {}, ["model.moe.top_k=5 is larger than model.moe.num_experts=4", "top_k <= 4"]),
    (dict(top_k=1), {}, ["top_k=1 with normalize_top_k=true", "normalize_top_k=false"]),
    (dict(shared_expert_gate=True), {}, ["shared_expert_gate=true without", "set shared_expert_ffn_size"]),
    (dict(layer_pattern=[1, 0]), {}, ["layer_pattern has 2 entries but model.num_layers=4", "one 0/1 per"]),
    (dict(layer_pattern=8), {}, ["layer_pattern=8 (every N-th layer) is larger than model.num_layers=4"]),
    (dict(first_dense_layers=4), {}, ["leaves no MoE layer", "lower first_dense_layers"]),
    ({}, {"add_bias_linear": True}, ["add_bias_linear=true with model.moe", "add_bias_linear=false"]),
])
def test_model_rules_name_the_field_and_the_fix(moe, model, expect):
    with pytest.raises(RecipeError) as e:
        make(moe, **{f"model__{k}": v for k, v in model.items()})
    assert all(x in str(e.value) for x in expect), str(e.value)


def errors(recipe, world):
    with pytest.raises(RecipeError) as e:
        validate(recipe, world)
    return str(e.value)


@pytest.mark.parametrize("world,moe,parallel,expect", [
    (8, dict(num_experts=6), dict(ep=4), ["num_experts=6 is not divisible by parallel.ep=4", "use ep in [1, 2]"]),
    (6, dict(num_experts=4), dict(ep=4), ["parallel.ep=4 does not divide the data-parallel degree dp=6",
                                          "use ep in [1, 2]"]),
    (8, {}, dict(ep=2, zero_stage=0), ["parallel.zero_stage=0 with parallel.ep=2", "parallel.zero_stage=1"]),
    (8, {}, dict(zero_stage=3), ["parallel.zero_stage=3 with model.moe", "zero_stage=1 or 2"]),
    (8, dict(ffn_hidden_size=33), dict(tp=2), ["model.moe.ffn_hidden_size=33 is not divisible by parallel.tp=2"]),
    (8, dict(shared_expert_ffn_size=30), dict(tp=4), ["shared_expert_ffn_size=30 is not divisible by parallel.tp=4"]),
    (8, dict(layer_pattern=[1, 1, 0, 0]), dict(ep=2, pp=2),
     ["parallel.ep=2 at parallel.pp=2", "stage 1: 2 decoder layer(s)", "at least one MoE layer"]),
])
def test_layout_rules_name_the_field_and_the_fix(world, moe, parallel, expect):
    msg = errors(make(moe, **{f"parallel__{k}": v for k, v in parallel.items()}), world)
    assert all(x in msg for x in expect), msg


def test_ep_without_experts_is_refused():
    recipe = make()
    recipe = recipe.model_copy(update={"model": recipe.model.model_copy(update={"moe": None})})
    recipe.parallel.ep = 2
    assert "parallel.ep=2 but the model has no experts" in errors(recipe, 8)


def test_valid_expert_parallel_layouts_pass():
    assert [w for w in validate(make(parallel__ep=2), 8) if w.level != "info"] == []
    assert [w for w in validate(make(parallel__ep=2, parallel__tp=2, parallel__pp=2), 8) if w.level != "info"] == []


@pytest.mark.parametrize("name,total,active", [("mixtral-8x7b", 46_702_792_704, 12.9e9),
                                               ("qwen3-30b-a3b", 30_532_122_624, 3.3e9)])
def test_moe_presets_count_as_released(name, total, active):
    m = recipe_from_dict(deep_merge(load_raw(f"models/{name}"), {"training": {"global_batch": 8}})).model
    assert count_parameters(m) == total
    assert abs(count_parameters(m, active=True) - active) / active < 0.02  # released: "12.9B" / "3.3B" activated


@pytest.mark.parametrize("layers,pp", [(4, 2), (5, 2), (7, 3), (61, 8), (12, 5), (3, 4)])
def test_uniform_split_is_deepspeeds_without_importing_it(layers, pp):
    """The MoE stage check computes DeepSpeed's uniform split in plain Python (`plan` must not import DeepSpeed: it
    prints to stdout on import); the boundaries equal DeepSpeed's own partition_balanced."""
    from deepspeed.runtime.utils import partition_balanced

    from recipes.parallel.partition import balanced_split

    weights = [0.0] + [1.0] * layers + [0.0, 0.0]
    assert balanced_split(weights, pp) == [int(b) for b in partition_balanced(weights=weights, num_parts=pp)]

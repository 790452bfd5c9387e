"""DeepSeek-V3 options that cannot go together are refused when the recipe loads, one line naming the field and the
fix; a recipe with MLA that is not a DeepSeek-V3 is refused by export-hf naming what differs."""
from __future__ import annotations

import pytest

from recipes.config.loading import RecipeError, load_recipe

pytestmark = pytest.mark.unit

RECIPE = "configs/runs/tiny-deepseek-cpu.yaml"
REFUSED = {
    "groups without group_top_k": (["model.moe.group_top_k="], "num_groups and model.moe.group_top_k come together"),
    "groups that do not split the experts": (["model.moe.num_groups=3"], "must split model.moe.num_experts=8"),
    "group_top_k too small for top_k": (["model.moe.top_k=6", "model.moe.group_top_k=2"], "raise group_top_k"),
    "bias with softmax scores": (["model.moe.score_function=softmax"], "expert_bias=true needs model.moe.score_function"),
    "MLA with query groups": (["model.num_query_groups=2"], "model.mla with model.num_query_groups=2"),
    "MLA with qk norm": (["model.qk_norm=true"], "model.mla with model.qk_norm=True"),
    "odd RoPE part": (["model.mla.qk_rope_head_dim=7"], "qk_rope_head_dim=7"),
    "yarn without MLA": (["model.mla=", "model.num_query_groups=2", "model.mtp=", "model.rope_scaling.type=yarn",
                          "model.rope_scaling.factor=4"], "type=yarn is supported with model.mla"),
    "MTP with learned positions": (["model.mla=", "model.position_embedding=learned"],
                                   "model.mtp with model.position_embedding=learned"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_impossible_combination_is_refused_naming_the_field(name):
    overrides, words = REFUSED[name]
    with pytest.raises(RecipeError) as e:
        load_recipe(RECIPE, overrides)
    assert words in str(e.value), str(e.value)


def test_export_refuses_an_mla_model_that_is_not_deepseek_v3():
    from recipes.hf.convert import UnsupportedModel, family

    assert family(load_recipe(RECIPE, []).model) == "deepseek_v3"
    m = load_recipe(RECIPE, ["model.moe.shared_expert_ffn_size=", "model.moe.layer_pattern=2"]).model
    with pytest.raises(UnsupportedModel) as e:
        family(m)
    assert "DeepseekV3ForCausalLM only" in str(e.value) and "shared_expert_ffn_size" in str(e.value)
    assert "first_dense_layers dense ones, then all MoE" in str(e.value)

"""The planner's exact parameter count equals the parameters of the model we instantiate (TP=1, one process), for
several model shapes; and the initial full weights do not depend on where the pipeline is cut."""
from __future__ import annotations


import pytest
import torch

from recipes.parallel.layout import Layout
from recipes.config.loading import recipe_from_dict

pytestmark = pytest.mark.unit

SHAPES = {
    "gpt: gelu, learned, layernorm, tied, bias": dict(activation="gelu", position_embedding="learned",
                                                     normalization="layernorm", tied_embeddings=True,
                                                     add_bias_linear=True, num_query_groups=None),
    "llama: swiglu, rope, rmsnorm, GQA, untied": dict(activation="swiglu", position_embedding="rope",
                                                     normalization="rmsnorm", tied_embeddings=False,
                                                     num_query_groups=2),
    "odd vocab, ffn default, MQA": dict(vocab_size=1000, ffn_hidden_size=None, num_query_groups=1, hidden_size=96,
                                        num_attention_heads=6),
    "deepseek: MLA, dense first layer, sigmoid experts, shared expert, 2 MTP depths": dict(
        num_query_groups=None, mla=dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                        v_head_dim=16),
        moe=dict(num_experts=4, top_k=2, ffn_hidden_size=32, shared_expert_ffn_size=32, first_dense_layers=1,
                 score_function="sigmoid", expert_bias=True, aux_loss_coeff=0.0),
        mtp=dict(num_layers=2)),
}


def _recipe(**model):
    base = dict(num_layers=3, hidden_size=64, num_attention_heads=4, ffn_hidden_size=160, vocab_size=512,
                seq_length=32)
    base.update(model)
    return recipe_from_dict({"model": base, "training": {"global_batch": 1}})


@pytest.mark.parametrize("name", list(SHAPES))
def test_planner_count_equals_instantiated_model(name, single_process_group):
    from recipes.model.layers import PlainDecoder, count_model_parameters
    from recipes.model.shape import count_parameters

    recipe = _recipe(**SHAPES[name])
    model = PlainDecoder(recipe, Layout())
    assert count_model_parameters(model) == count_parameters(recipe.model, tp=1)


def test_initial_weights_do_not_depend_on_the_pipeline_cut(single_process_group):
    """Each pipeline layer draws from its own seed: building layer 3 alone gives the same weights as in the stack."""
    from recipes.model.layers import DecoderLayerPipe, PlainDecoder, SEED_STRIDE, transformer_config

    recipe = _recipe()
    stack = PlainDecoder(recipe, Layout())
    config = transformer_config(recipe.model, tp=1)
    alone = DecoderLayerPipe(config, recipe.model, 3, recipe.training.seed + SEED_STRIDE * 3)
    in_stack, by_itself = getattr(stack, "3").state_dict(), alone.state_dict()
    assert list(in_stack) == list(by_itself)  # the same entries: none skipped by the comparison below
    for name, a in in_stack.items():
        if a is not None:
            assert torch.equal(a, by_itself[name]), name
    assert not torch.equal(getattr(stack, "2").state_dict()["mlp.linear_fc1.weight"],
                           getattr(stack, "3").state_dict()["mlp.linear_fc1.weight"])


@pytest.mark.parametrize("name", list(SHAPES))
def test_partition_inputs_match_the_built_layers(name, single_process_group):
    """recipes.parallel.partition predicts the pipeline split (per-layer parameter counts) and each stage's optimizer
    param groups without building the model; both must equal what the real layers and build_optimizer give."""
    from recipes.train.engine import build_optimizer
    from recipes.model.layers import layer_builders, transformer_config
    from recipes.parallel.partition import GROUPS_OF_LAYER, layer_names, layer_weights

    recipe = _recipe(**SHAPES[name])
    builders = layer_builders(recipe.model, transformer_config(recipe.model, 1), recipe.training.seed)
    names = layer_names(recipe.model)
    # the tied head is layer 0's embedding again, not a layer of its own
    built = [builders[i]() if i in builders else builders[0]() for i in range(len(names))]
    assert [type(layer).__name__ for layer in built] == names
    assert [sum(p.numel() for p in layer.parameters()) for layer in built] == \
        layer_weights(recipe.model, 1, "parameters")
    for layer_name, layer in zip(names, built, strict=True):
        groups = build_optimizer(layer, recipe, torch.device("cpu")).param_groups
        used = {kind for kind, g in zip(("decay", "no_decay"), groups) if g["params"]}
        assert used == GROUPS_OF_LAYER[layer_name] - {"experts"}, layer_name  # (a group of their own at ep > 1)


def test_engine_refuses_a_split_with_uneven_param_groups():
    """The engine's own check refuses, on every rank alike, a split that would hang ZeRO-1: embedding and head alone
    on their ranks (the parameter-balanced split of a large vocabulary over few layers); the uniform split passes."""
    from recipes.parallel.layout import Layout
    from recipes.train.engine import _refuse_uneven_stage_groups

    recipe = _recipe(num_layers=2, vocab_size=3000)
    layout = Layout(pp=4, zero_stage=1)
    _refuse_uneven_stage_groups(recipe, Layout(pp=2, zero_stage=1))  # decoder layers on each rank
    recipe.parallel.pipeline_partition = "parameters"
    with pytest.raises(ValueError, match=r"stage 0: EmbeddingPipe -> 1 .*stage 3: OutputHeadPipe -> 1"):
        _refuse_uneven_stage_groups(recipe, layout)

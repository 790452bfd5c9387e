"""The planner's exact parameter count equals the parameters of the model we instantiate (TP=1, one process), for
several model shapes; and the initial full weights do not depend on where the pipeline is cut."""
from __future__ import annotations

import socket

import pytest
import torch

from recipes.layout import Layout
from recipes.loading import recipe_from_dict

SHAPES = {
    "gpt: gelu, learned, layernorm, tied, bias": dict(activation="gelu", position_embedding="learned",
                                                     normalization="layernorm", tied_embeddings=True,
                                                     add_bias_linear=True, num_query_groups=None),
    "llama: swiglu, rope, rmsnorm, GQA, untied": dict(activation="swiglu", position_embedding="rope",
                                                     normalization="rmsnorm", tied_embeddings=False,
                                                     num_query_groups=2),
    "odd vocab, ffn default, MQA": dict(vocab_size=1000, ffn_hidden_size=None, num_query_groups=1, hidden_size=96,
                                        num_attention_heads=6),
}


def _recipe(**model):
    base = dict(num_layers=3, hidden_size=64, num_attention_heads=4, ffn_hidden_size=160, vocab_size=512,
                seq_length=32)
    base.update(model)
    return recipe_from_dict({"model": base, "training": {"global_batch": 1}})


@pytest.fixture(scope="module")
def single_process_group():
    from megatron.core import parallel_state

    # Another in-process test (e.g. the HF export checks) may already hold a world of one: reuse it, and tear down
    # only what this fixture made.
    made_world = not torch.distributed.is_initialized()
    if made_world:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    made_groups = not parallel_state.model_parallel_is_initialized()
    if made_groups:
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    assert torch.distributed.get_world_size() == 1 and parallel_state.get_tensor_model_parallel_world_size() == 1
    yield
    if made_groups:
        parallel_state.destroy_model_parallel()
    if made_world:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("name", list(SHAPES))
def test_planner_count_equals_instantiated_model(name, single_process_group):
    from recipes.model import PlainDecoder, count_model_parameters
    from recipes.planner import count_parameters

    recipe = _recipe(**SHAPES[name])
    model = PlainDecoder(recipe, Layout())
    assert count_model_parameters(model) == count_parameters(recipe.model, tp=1)


def test_initial_weights_do_not_depend_on_the_pipeline_cut(single_process_group):
    """Each pipeline layer draws from its own seed: building layer 3 alone gives the same weights as in the stack."""
    from recipes.model import DecoderLayerPipe, PlainDecoder, SEED_STRIDE, transformer_config

    recipe = _recipe()
    stack = PlainDecoder(recipe, Layout())
    config = transformer_config(recipe.model, tp=1)
    alone = DecoderLayerPipe(config, recipe.model, 3, recipe.training.seed + SEED_STRIDE * 3)
    for (name, a), (_, b) in zip(getattr(stack, "3").state_dict().items(), alone.state_dict().items()):
        if a is not None:
            assert torch.equal(a, b), name
    assert not torch.equal(getattr(stack, "2").state_dict()["mlp.linear_fc1.weight"],
                           getattr(stack, "3").state_dict()["mlp.linear_fc1.weight"])

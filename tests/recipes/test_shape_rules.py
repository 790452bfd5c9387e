"""Model shapes the kernels cannot run are refused with the recipe, one line each naming the field and a shape that
works (issue 42 item 3; recipes.config.shape_rules and Layout.problems): an odd head dim under RoPE, a dense FFN
that TP cannot split; and the hidden size no longer has to divide by the heads when model.head_dim says the width
(Qwen3-style shapes were refused). A head dim that is not a multiple of 8 is not refused: torch's flash kernel pads
it (its check is head dim <= 256 only), and the kernel a GPU picks is checked on the GPU at start."""
import pytest

from recipes.config.loading import RecipeError
from recipes.planner.validation import validate
from tests.recipes.test_validation_rules import errors_of, make

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("changes, expect", [
    (dict(model__hidden_size=120, model__num_attention_heads=8, model__num_query_groups=4),
     "the head dim (hidden_size / num_attention_heads = 120 / 8) = 15 is odd: RoPE rotates pairs of channels, so "
     "each head needs an even width; use model.num_attention_heads=4"),
    (dict(model__head_dim=15),
     "model.head_dim = 15 is odd: RoPE rotates pairs of channels, so each head needs an even width; use "
     "model.head_dim=16"),
    (dict(model__head_dim=15, cluster__device="cpu", cluster__backend="gloo", training__precision="fp32"),
     "model.head_dim = 15 is odd: RoPE rotates pairs of channels, so each head needs an even width; use "
     "model.head_dim=16"),  # on CPU too: the rope table itself is built of channel pairs
], ids=["odd-from-hidden", "odd-head-dim", "odd-on-cpu"])
def test_an_odd_head_dim_under_rope_is_refused_once(changes, expect):
    msg = errors_of(make(**changes))
    assert expect in msg and "1 error(s)" in msg, msg
    validate(make(**changes, model__position_embedding="learned", training__allow_math_attention=True))


def test_a_head_dim_that_is_not_a_multiple_of_8_is_not_refused():
    """flash pads it (torch's check_head_dim_size_flash: <= 256 only, sm80-sm90); refusing it would be false."""
    validate(make(model__hidden_size=160, model__num_attention_heads=8, model__num_query_groups=4))  # head dim 20
    validate(make(model__head_dim=320))  # above 256: the math kernel, which fast_path allows there


def test_an_explicit_head_dim_needs_no_divisible_hidden_size():
    validate(make(model__hidden_size=250, model__num_attention_heads=8, model__head_dim=32))  # Qwen3-style
    msg = errors_of(make(model__hidden_size=250, model__num_attention_heads=8))
    assert ("model.hidden_size=250 is not divisible by model.num_attention_heads=8; pick heads that divide it (e.g. "
            "10), or set model.head_dim") in msg


def test_a_dense_ffn_tp_cannot_split_is_refused_naming_the_tp_that_can():
    msg = errors_of(make(model__ffn_hidden_size=511))  # tp 2
    assert ("model.ffn_hidden_size=511 is not divisible by parallel.tp=2: the MLP is split over TP ranks "
            "(megatron-core's parallel linears); use a multiple of 2, or tp in [1, 7]") in msg
    validate(make(model__ffn_hidden_size=511, parallel__tp=1, parallel__pp=2))
    # an MoE model whose every layer is MoE has no dense MLP: only its experts' size counts (Layout's expert rule)
    validate(make(model__ffn_hidden_size=511, model__moe={"num_experts": 4, "ffn_hidden_size": 256},
                  parallel__ep=2))


def test_recipe_error_lists_shape_problems_with_the_others():
    with pytest.raises(RecipeError) as e:
        validate(make(model__head_dim=15, model__ffn_hidden_size=511))
    assert "2 error(s)" in str(e.value)  # each once

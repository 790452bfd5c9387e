"""Checkpoint families in one process: Llama 3.x (llama3 RoPE scaling, theta 500000), Qwen2 (q/k/v bias, tied and
untied) and Mistral (sliding window) against transformers' own classes built from small configs (nothing downloaded).

Both directions are checked against an independent forward pass:
  import  transformers model (random init, biases and norms perturbed so a wrong mapping shows) -> `from_llama` ->
          our `PlainDecoder` (megatron-core layers, our fp32 RoPE table) -> logits == the transformers logits
  export  our model's own init (perturbed the same way) -> `to_hf` -> the transformers class the export names ->
          logits == ours
fp32 on CPU; the same math in another order of additions differs by ~1e-6, a swapped q/k/v, a lost bias or wrong
RoPE frequencies by O(0.1..1), so the bound is 1e-4. The checkpoint round trip (import at TP=2 -> export) is in
test_families_checkpoint.py.
"""
from __future__ import annotations

import pytest
import torch

from interop_runs import RECIPE
from tests.support.plain_model import build_plain_model, logits
from recipes.checkpoint.format.shards import strip_vocab
from recipes.hf.convert import UnsupportedModel, from_llama, to_hf
from recipes.hf.importer import hf_recipe

pytestmark = pytest.mark.unit

TOL = 1e-4
SEQ = 64
# head_dim 16 at theta 500000 has wavelengths 6.3, 32.5, 168, ... tokens; with original_max_position_embeddings 64
# (low/high_freq_factor 1/4: bands at 64 and 16 tokens) the table has a kept, a smoothed and scaled frequencies.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=4 * SEQ, initializer_range=0.1)


def hf_config(kind: str, **kw):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    if kind == "llama3":
        return LlamaConfig(**{**SHAPE, "rope_parameters": LLAMA3_ROPE, "rms_norm_eps": 1e-5, **kw})
    plain_rope = {"rope_type": "default", "rope_theta": 1e6}
    if kind == "qwen2":
        return Qwen2Config(**{**SHAPE, "rope_parameters": plain_rope, "rms_norm_eps": 1e-6, **kw})
    if kind == "mistral":
        return MistralConfig(**{**SHAPE, "rope_parameters": plain_rope, **kw})
    raise ValueError(kind)


def perturb(named_params, seed: int = 0) -> None:
    """Norm weights away from 1 and biases away from 0 (both initialise to constants that hide a wrong mapping)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in named_params:
            if p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def hf_model(kind: str, tmp_path, seed: int = 0, **kw):
    """A transformers model of `kind`, random init, saved to tmp_path/kind (the import reads config.json)."""
    from transformers import AutoModelForCausalLM

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(kind, **kw), dtype=torch.float32).eval()
    perturb(model.named_parameters(), seed)
    model.save_pretrained(str(tmp_path / kind))
    return model, tmp_path / kind


def tokens(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(seed))


def imported(hf_dir, hf, *overrides):
    recipe, _ = hf_recipe(str(hf_dir), RECIPE, [f"model.seq_length={SEQ}", *overrides])
    return recipe, build_plain_model(recipe, from_llama(hf.state_dict(), recipe.model))


def max_diff(ours, hf, x, vocab) -> float:
    with torch.no_grad():
        return (logits(ours, x, vocab) - hf(x).logits).abs().max().item()


@pytest.mark.parametrize("kind,kw", [("llama3", {}), ("llama3", {"tie_word_embeddings": True}),
                                     ("qwen2", {"tie_word_embeddings": True}),
                                     ("qwen2", {"tie_word_embeddings": False}), ("mistral", {"sliding_window": SEQ})],
                         ids=["llama3.1-untied", "llama3.2-tied", "qwen2-tied", "qwen2-untied",
                              "mistral-window-no-op"])
def test_import_logits_match_transformers(kind, kw, tmp_path):
    hf, hf_dir = hf_model(kind, tmp_path, **kw)
    recipe, ours = imported(hf_dir, hf)
    m = recipe.model
    assert (m.add_qkv_bias, m.add_bias_linear) == ((True, False) if kind == "qwen2" else (False, False))
    assert m.tied_embeddings == hf.config.tie_word_embeddings
    x = tokens(m.vocab_size)
    diff = max_diff(ours, hf, x, m.vocab_size)
    print(f"import {kind} {kw}: max |logits diff| = {diff:.2e}")
    assert diff <= TOL, f"{kind}: imported logits differ from transformers' by {diff:.2e}"


def test_llama3_scaling_is_what_makes_the_logits_match(tmp_path):
    """The parity above depends on the llama3 frequencies: the same weights with plain RoPE (theta kept) are far off,
    so a test at this size does notice a scaling bug."""
    hf, hf_dir = hf_model("llama3", tmp_path)
    recipe, _ = imported(hf_dir, hf)
    m = recipe.model
    assert m.rotary_base == 500000.0 and m.rope_scaling.factor == 8.0
    assert m.rope_scaling.original_max_position_embeddings == 64
    _, plain = imported(hf_dir, hf, "model.rope_scaling=")
    assert max_diff(plain, hf, tokens(m.vocab_size), m.vocab_size) > 100 * TOL


def test_rope_table_equals_transformers_llama3_frequencies():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from recipes.config.schema import RopeScalingConfig
    from recipes.model.layers import rope_inv_freq

    rope = dict(LLAMA3_ROPE, original_max_position_embeddings=8192, factor=32.0)  # Llama 3.2's values
    cfg = LlamaConfig(hidden_size=2048, num_attention_heads=32, max_position_embeddings=131072,
                      rope_parameters=rope)
    theirs, scale = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ours = rope_inv_freq(64, 500000.0, RopeScalingConfig(factor=32.0, original_max_position_embeddings=8192))
    assert scale == 1.0 and torch.equal(ours, theirs)  # bit for bit, not just close


@pytest.mark.parametrize("kind,tied,qkv_bias", [("llama3", False, False), ("qwen2", True, True),
                                                ("qwen2", False, True)],
                         ids=["llama3", "qwen2-tied", "qwen2-untied"])
def test_export_logits_match_ours(kind, tied, qkv_bias, tmp_path):
    """Our model's own initialisation -> to_hf -> the transformers class named in the exported config."""
    from transformers import AutoModelForCausalLM

    hf, hf_dir = hf_model(kind, tmp_path, tie_word_embeddings=tied)
    recipe, _ = imported(hf_dir, hf, "training.seed=7")  # the architecture only; weights from our init below
    m = recipe.model
    assert m.qkv_bias == qkv_bias
    from recipes.model.layers import PlainDecoder, count_model_parameters
    from recipes.model.shape import count_parameters
    from recipes.parallel.layout import Layout

    ours = PlainDecoder(recipe, Layout(tp=1, pp=1, dp=1, zero_stage=0)).eval()
    assert count_model_parameters(ours) == count_parameters(m, tp=1)  # the planner's count includes the qkv bias
    perturb(ours.named_parameters(), seed=3)
    weights = {k: strip_vocab(k, v, m.vocab_size) for k, v in ours.state_dict().items()
               if not k.endswith("_extra_state")}
    config, state = to_hf(weights, m)
    theirs = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    theirs.load_state_dict(state, strict=True)
    assert type(theirs).__name__ == {"llama3": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[kind]
    assert theirs.config.rope_parameters["rope_type"] == ("llama3" if kind == "llama3" else "default")
    diff = max_diff(ours, theirs, tokens(m.vocab_size, seed=1), m.vocab_size)
    print(f"export {kind} tied={tied}: max |logits diff| = {diff:.2e}")
    assert diff <= TOL, f"{kind}: exported logits differ from ours by {diff:.2e}"


def test_mistral_sliding_window_shorter_than_seq_length_is_refused(tmp_path):
    _, hf_dir = hf_model("mistral", tmp_path, sliding_window=16)
    with pytest.raises(UnsupportedModel) as e:
        hf_recipe(str(hf_dir), RECIPE, [f"model.seq_length={SEQ}"])
    msg = str(e.value)
    assert "sliding_window=16" in msg and f"model.seq_length={SEQ}" in msg and "model.seq_length=16" in msg, msg
    recipe, _ = hf_recipe(str(hf_dir), RECIPE, ["model.seq_length=16"])  # the advertised fix is accepted
    assert recipe.model.seq_length == 16


def test_qwen2_sliding_window_only_counts_when_used(tmp_path):
    from recipes.hf.convert import sliding_window

    assert sliding_window(hf_config("qwen2", sliding_window=8)) is None  # use_sliding_window defaults to false
    assert sliding_window(hf_config("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0)) == 8
    # windows only from layer max_window_layers on: with 2 layers and max_window_layers=2 no layer slides
    assert sliding_window(hf_config("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2)) is None


def test_unsupported_rope_type_names_the_field(tmp_path):
    from recipes.hf.convert import model_fields_from_hf_config

    cfg = hf_config("llama3")
    cfg.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    with pytest.raises(UnsupportedModel, match=r"rope_parameters.rope_type=yarn \(supported: default, llama3"):
        model_fields_from_hf_config(cfg)


def test_cli_refuses_a_sliding_window_before_writing_anything(tmp_path, capsys):
    from recipes.hf.importer import main as import_main

    _, hf_dir = hf_model("mistral", tmp_path, sliding_window=32)
    out = tmp_path / "ckpt"
    code = import_main(["--hf", str(hf_dir), "--out", str(out), "--config", RECIPE, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "sliding_window=32 (mistral)" in err and "Set model.seq_length=32" in err, err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt")]


def test_released_llama31_config_json_format_is_read(tmp_path):
    """Llama 3.1's config.json as released (rope_theta at the top, rope_scaling with rope_type), not the
    rope_parameters that transformers 5 writes: the import must read both."""
    import json

    from transformers import AutoConfig

    from recipes.hf.convert import model_fields_from_hf_config

    released = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 300, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "hidden_act": "silu",
                "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 8192,
                                                         "rope_type": "llama3"},
                "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(released))
    fields = model_fields_from_hf_config(AutoConfig.from_pretrained(str(tmp_path)))
    assert fields["rotary_base"] == 500000.0
    assert fields["rope_scaling"] == {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

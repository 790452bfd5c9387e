"""Every cross-field rule of recipes.planner.validation: errors (all listed at once, each with field, values and fix) and
warnings; plus the loader's own checks (unknown keys, bad YAML, missing fields, non-positive sizes)."""
import pytest

from recipes.config.loading import RecipeError, load_recipe, recipe_from_dict
from recipes.planner.validation import validate

pytestmark = pytest.mark.unit


def make(**sections):
    """A small valid recipe on one 8 x H100 node, with `sections` merged over it (dotted keys as 'a.b')."""
    data = {
        "name": "t",
        "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_query_groups": 4,
                  "ffn_hidden_size": 512, "vocab_size": 1024, "seq_length": 128},
        "parallel": {"tp": 2, "pp": 2, "zero_stage": 1, "micro_batch": 1},
        "training": {"global_batch": 16, "schedule": {"warmup_steps": 10}},
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu_memory_gb": 80, "device": "cuda"},
    }
    return recipe_from_dict(with_sections(data, sections))


def with_sections(data: dict, sections: dict) -> dict:
    """`data` with each `a__b=value` of `sections` set at data[a][b] (nested keys as keyword names)."""
    for key, value in sections.items():
        node = data
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return data


def errors_of(recipe, world_size=None) -> str:
    with pytest.raises(RecipeError) as e:
        validate(recipe, world_size)
    return str(e.value)


def test_valid_recipe_has_no_errors_or_warnings():
    assert validate(make()) == []


@pytest.mark.parametrize("changes,expect", [
    (dict(model__hidden_size=250), ["model.hidden_size=250", "num_attention_heads=8"]),
    (dict(parallel__tp=8, model__num_query_groups=8, model__num_attention_heads=4, model__hidden_size=256),
     ["model.num_attention_heads=4", "parallel.tp=8", "use tp in [1, 2, 4]"]),
    (dict(parallel__tp=4, model__num_query_groups=2), ["model.num_query_groups=2", "parallel.tp=4"]),
    (dict(model__num_query_groups=4, model__num_attention_heads=6, model__hidden_size=192, parallel__tp=1),
     ["num_attention_heads=6 is not divisible by model.num_query_groups=4"]),
    (dict(parallel__pp=8, parallel__tp=1), ["parallel.pp=8", "model.num_layers=4", "pp <= 4"]),
    (dict(parallel__pp=4, parallel__tp=1, parallel__pipeline_partition="parameters", model__vocab_size=32000),
     ["pipeline_partition=parameters at parallel.pp=4", "stage 0: EmbeddingPipe -> 1 optimizer param group",
      "stage 1: 2 decoder layer(s) -> 2", "stage 3: OutputHeadPipe", "would hang", "pipeline_partition=uniform"]),
    (dict(parallel__dp=3), ["tp x pp x dp = 2 x 2 x 3 = 12", "world size is 8"]),
    (dict(parallel__tp=3, model__num_attention_heads=6, model__num_query_groups=6, model__hidden_size=192),
     ["world size 8", "not divisible by parallel.tp x pp = 3 x 2"]),
    (dict(training__global_batch=9), ["training.global_batch=9", "micro_batch x dp = 1 x 2 = 2"]),
    (dict(parallel__zero_stage=2), ["parallel.zero_stage=2 with parallel.pp=2", "zero_stage=1 or parallel.pp=1"]),
    (dict(parallel__zero_stage=3), ["parallel.zero_stage=3 with parallel.pp=2"]),
    (dict(parallel__tp=1, parallel__sequence_parallel=True), ["sequence_parallel=true needs parallel.tp > 1"]),
    (dict(training__precision="fp16"), ["precision=fp16 without training.loss_scale", "loss_scale=0"]),
])
def test_each_error_names_field_values_and_fix(changes, expect):
    msg = errors_of(make(**changes))
    for text in expect:
        assert text in msg, (text, msg)


def test_uniform_split_gives_every_stage_decoder_layers_even_when_uneven():
    """The default split (decoder layers evenly, Megatron's) is accepted where the parameter split is refused above,
    and for a layer count pp does not divide (4 layers over 3 stages)."""
    from recipes.parallel.partition import layer_names, stage_boundaries

    for recipe in (make(parallel__pp=4, parallel__tp=1, model__vocab_size=32000),
                   make(parallel__pp=3, parallel__tp=1, cluster__gpus_per_node=6, training__global_batch=12)):
        assert validate(recipe) == []  # no error and no warning
        # DeepSpeed's own split of the specs: every stage holds decoder layers, 4 in all, at most one apart
        parts = stage_boundaries(recipe.model, 1, recipe.parallel.pp, recipe.parallel.pipeline_partition)
        names = layer_names(recipe.model)
        layers = [names[a:b].count("DecoderLayerPipe") for a, b in zip(parts, parts[1:])]
        assert len(layers) == recipe.parallel.pp and min(layers) >= 1 and sum(layers) == 4, layers
        assert max(layers) - min(layers) <= 1, layers


def test_global_batch_error_suggests_a_multiple():
    msg = errors_of(make(training__global_batch=10, parallel__micro_batch=2))  # dp = 2 -> per step 4
    assert "use global_batch=8" in msg or "use global_batch=12" in msg


def test_all_errors_are_listed_together():
    msg = errors_of(make(parallel__zero_stage=3, parallel__tp=1, parallel__sequence_parallel=True,
                         training__precision="fp16", model__hidden_size=250))
    assert "4 error(s)" in msg
    for text in ("zero_stage=3", "sequence_parallel", "fp16", "hidden_size=250"):
        assert text in msg


def test_world_size_argument_overrides_the_cluster():
    validate(make(), world_size=4)  # 2 x 2 x 1
    assert "world size 6" in errors_of(make(), world_size=6)


def test_fp16_with_loss_scale_is_fine():
    assert validate(make(training__precision="fp16", training__loss_scale=0)) == []


def test_memory_error_shows_breakdown_and_fixes():
    big = dict(model__num_layers=80, model__hidden_size=8192, model__num_attention_heads=64,
               model__num_query_groups=8, model__ffn_hidden_size=28672, model__vocab_size=32000,
               model__seq_length=4096, parallel__tp=1, parallel__pp=1, parallel__zero_stage=1,
               parallel__micro_batch=1, training__global_batch=64)
    msg = errors_of(make(**big))
    assert "predicted memory per GPU" in msg and "exceeds cluster.gpu_memory_gb=80" in msg
    for part in ("params", "grads", "optimizer", "activations", "buffers"):
        assert part in msg
    assert "no single change" in msg  # 70B cannot fit on 8 GPUs by one knob
    # A 7B at micro-batch 8 without recompute does not fit on one H100, but recompute or micro-batch 1 does.
    seven = dict(model__num_layers=32, model__hidden_size=4096, model__num_attention_heads=32,
                 model__num_query_groups=32, model__ffn_hidden_size=11008, model__vocab_size=32000,
                 model__seq_length=4096, parallel__tp=1, parallel__pp=1, parallel__zero_stage=3,
                 parallel__micro_batch=8, training__global_batch=64)
    msg = errors_of(make(**seven))
    assert "parallel.recompute=full" in msg and "parallel.micro_batch=1" in msg


def test_memory_is_not_judged_on_cpu_clusters():
    assert validate(make(cluster__device="cpu", cluster__gpu_memory_gb=0.001, cluster__backend="gloo")) == []


def warnings_of(recipe):
    return [str(w) for w in validate(recipe)]


def test_lr_not_rescaled_warns_with_the_rescaled_value():
    ws = warnings_of(make(training__global_batch=64, training__reference_global_batch=16,
                          training__reference_lr=3e-4, training__optimizer={"lr": 3e-4}))
    assert any("training.optimizer.lr" in w and "from the preset's 16 to 64" in w and "lr=0.0006" in w for w in ws)
    rescaled = make(training__global_batch=64, training__reference_global_batch=16, training__reference_lr=3e-4,
                    training__optimizer={"lr": 6e-4})
    assert not any("optimizer.lr" in w for w in warnings_of(rescaled))
    same = make(training__global_batch=16, training__reference_global_batch=16, training__reference_lr=3e-4)
    assert warnings_of(same) == []


def test_no_warmup_with_a_large_batch_warns():
    ws = warnings_of(make(training__global_batch=4096, training__schedule={"warmup_steps": 0}))
    assert any("warmup_steps" in w and "524,288 tokens" in w for w in ws)
    assert not any("warmup" in w for w in warnings_of(make(training__schedule={"warmup_steps": 0})))


def test_tp_across_nodes_warns():
    r = make(parallel__tp=8, parallel__pp=1, model__num_query_groups=8, cluster__gpus_per_node=4,
             cluster__nodes=2)
    ws = warnings_of(r)
    assert any("parallel.tp" in w and "cross InfiniBand" in w and "gpus_per_node=4" in w for w in ws)


def test_vocab_padding_is_reported_as_info():
    ws = validate(make(model__vocab_size=1000))
    assert [w.level for w in ws] == ["info"]
    assert "1000 is padded to 1024" in str(ws[0]) and "128 x 2" in str(ws[0])


# --- the loader's checks, exercised through files --------------------------------------------------------------------

def test_unknown_key_did_you_mean(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("extends: [models/tiny]\nparallel: {zero_stag: 2}\ntraining: {global_batch: 8}\n")
    with pytest.raises(RecipeError, match=r"parallel.zero_stag: unknown key; did you mean 'parallel.zero_stage'"):
        load_recipe(f)


def test_unparseable_yaml_reports_line_and_column(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model:\n  num_layers: 4\n  hidden_size: [64\ntraining: {global_batch: 8}\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(f)
    assert f"{f}:4:" in str(e.value) and "invalid YAML" in str(e.value)


def test_missing_required_field_and_non_positive_sizes(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("extends: [models/tiny]\n")
    with pytest.raises(RecipeError, match=r"training: required field missing"):
        load_recipe(f)
    with pytest.raises(RecipeError, match=r"model.hidden_size = 0: Input should be greater than 0"):
        load_recipe(f, ["training.global_batch=8", "model.hidden_size=0"])
    with pytest.raises(RecipeError, match=r"parallel.tp = -2"):
        load_recipe(f, ["training.global_batch=8", "parallel.tp=-2"])


def test_unknown_preset_suggests_names():
    with pytest.raises(RecipeError, match=r"unknown recipe or preset 'models/lama-7b'; did you mean models/llama-7b"):
        load_recipe("models/lama-7b")


def test_rope_scaling_fields_are_checked():
    tiny = "configs/runs/tiny-cpu.yaml"
    r = load_recipe(tiny, ["model.rope_scaling.factor=8", "model.rotary_base=500000"])
    assert (r.model.rope_scaling.type, r.model.rope_scaling.original_max_position_embeddings) == ("llama3", 8192)
    with pytest.raises(RecipeError, match=r"high_freq_factor=1.0 must be greater than low_freq_factor=1.0"):
        load_recipe(tiny, ["model.rope_scaling.factor=8", "model.rope_scaling.high_freq_factor=1"])
    with pytest.raises(RecipeError, match=r"model.rope_scaling.factor = 0.5: Input should be greater than or equal"):
        load_recipe(tiny, ["model.rope_scaling.factor=0.5"])
    with pytest.raises(RecipeError, match=r"model.rope_scaling.type = 'ntk': Input should be 'llama3' or 'yarn'"):
        load_recipe(tiny, ["model.rope_scaling.type=ntk", "model.rope_scaling.factor=2"])
    with pytest.raises(RecipeError, match=r"model.rope_scaling.type=yarn is supported with model.mla .* only; use type"):
        load_recipe(tiny, ["model.rope_scaling.type=yarn", "model.rope_scaling.factor=2"])
    with pytest.raises(RecipeError, match=r"rope_scaling is set but model.position_embedding=learned; remove"):
        load_recipe(tiny, ["model.position_embedding=learned", "model.rope_scaling.factor=8"])


def test_memory_inside_the_headroom_warns_and_over_the_device_refuses():
    """Llama-7B on one 8 x A100-80GB node: PP=2 x DP=4 with ZeRO-0 is predicted at ~72.8 GiB, within the device's
    80 GB = 74.5 GiB but above the 67.1 GiB budget that keeps 10% free: a warning with a fix, not an error."""
    tight = load_recipe("configs/examples/c-llama-7b-one-node.yaml",
                        ["parallel.pp=2", "parallel.zero_stage=0", "parallel.micro_batch=1"])
    (w,) = [w for w in validate(tight) if w.level == "warning"]
    assert w.field == "parallel" and "fits the 80 GB (74.5 GiB) but not the 67.1 GiB budget" in w.message
    assert "these single changes would fit:" in w.message and "parallel.zero_stage=1 (44.1 GiB)" in w.message
    over = load_recipe("configs/examples/c-llama-7b-one-node.yaml", ["parallel.micro_batch=2"])  # ~75.0 GiB
    msg = errors_of(over)
    assert "exceeds cluster.gpu_memory_gb=80 (80 GB (74.5 GiB))" in msg and "parallel.micro_batch=1" in msg

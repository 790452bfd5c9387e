"""One rank of tests/recipes/test_planner_real.py (2 gloo processes, env:// rendezvous): parameters per rank of the
instantiated model at TP=2, then model-state memory per rank under ZeRO 0/1/2/3 at DP=2 (recipes.tools.measure_zero).
Both in one process pair so that torch, megatron-core and DeepSpeed are imported once. Prints one JSON line."""
import json
import sys

RECIPE = "configs/runs/tiny-cpu.yaml"
COUNT_PRESETS = ["tiny", "tiny-gpt"]  # rope/rmsnorm/swiglu/GQA/untied and learned/layernorm/gelu/bias/tied
ZERO_SHAPE = ["model.num_layers=2", "model.hidden_size=256", "model.num_attention_heads=4",
              "model.num_query_groups=4", "model.ffn_hidden_size=704", "model.vocab_size=4096"]  # ~2.3M params


def main() -> None:
    import torch
    from megatron.core import parallel_state

    from recipes.train.engine import init_distributed
    from recipes.parallel.layout import Layout
    from recipes.config.loading import load_recipe
    from recipes.tools.measure_zero import _worker
    from recipes.model.layers import PlainDecoder, count_model_parameters

    init_distributed(load_recipe(RECIPE))
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=1,
                                             order="tp-dp-pp")
    counts = {}
    for name in COUNT_PRESETS:
        recipe = load_recipe(f"models/{name}", ["training.global_batch=8"])
        counts[name] = count_model_parameters(PlainDecoder(recipe, Layout(tp=2, dp=1)))
    parallel_state.destroy_model_parallel()
    zero = _worker(RECIPE, ZERO_SHAPE, [0, 1, 2, 3], 2)
    print(json.dumps({"rank": torch.distributed.get_rank(), "tp2_counts": counts, "zero": zero}), flush=True)


if __name__ == "__main__":
    sys.exit(main())

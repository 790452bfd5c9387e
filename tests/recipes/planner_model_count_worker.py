"""Worker for test_planner_model_count.py: build recipes.model's PlainDecoder at a TP degree over gloo and print the
parameters this rank holds (one JSON line)."""
import json
import os
import sys

import torch


def main(port: str, rank: int, world: int, tp: int, names: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
                                             order="tp-dp-pp")
    from recipes.layout import Layout
    from recipes.loading import load_recipe
    from recipes.model import PlainDecoder, count_model_parameters

    counts = {}
    for name in names:
        recipe = load_recipe(f"models/{name}", ["training.global_batch=8"])
        counts[name] = count_model_parameters(PlainDecoder(recipe, Layout(tp=tp, dp=world // tp)))
    print(json.dumps({"rank": rank, "counts": counts}), flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])

"""One rank of test_group_timeouts: the training set-up of recipes.train.trainer.run (init_distributed ->
groups.build -> initialize), then every process group this rank belongs to, with its timeout, to JSON."""
from __future__ import annotations

import json
import os
import sys
import warnings

import torch

warnings.filterwarnings("ignore")


def main(out_dir: str, config: str, *overrides: str) -> None:
    from torch.distributed import distributed_c10d as c10d

    from recipes.train import groups
    from recipes.train.engine import init_distributed, initialize
    from recipes.parallel.layout import Layout
    from recipes.config.loading import load_recipe

    recipe = load_recipe(config, list(overrides))
    device = init_distributed(recipe)
    layout = Layout.from_recipe(recipe, torch.distributed.get_world_size())
    groups.build(layout)
    initialize(recipe, layout, device, total_steps=4)
    groups = []
    for pg in list(c10d._world.pg_map):  # every group this rank is a member of (megatron-core's and DeepSpeed's)
        backend = pg._get_backend(torch.device("cpu"))
        groups.append({"name": c10d._world.pg_names.get(pg, "?"), "size": pg.size(),
                       "timeout_s": backend.options._timeout.total_seconds()})
    rank = torch.distributed.get_rank()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(groups, f)
    torch.distributed.barrier()
    os._exit(0)  # no teardown needed: the test reads the files


if __name__ == "__main__":
    main(*sys.argv[1:])

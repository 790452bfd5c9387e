"""A small data-parallel training program for the launcher tests (stands in for recipes.train.cli's CLI).

Same contract: `--config RECIPE [section.key=value ...]`, reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, ignores
--local_rank. Every rank trains a tiny MLP on its slice of a seeded global batch and all-reduces gradients over gloo,
so the losses depend only on the recipe (seed, global batch, steps), not on how the ranks are spread over nodes.
Rank 0 writes the losses as JSON to $TOY_OUT. $TOY_STEP_SLEEP slows each step (for the kill test).
With $TOY_CKPT set, SIGTERM is a pre-emption (like recipes.train.signals): the ranks agree to stop after
the current step and rank 0 saves $TOY_CKPT/step_N/ (model.pt, then $TOY_SAVE_SECONDS of a slow file system, then
complete.json, the marker recipes/checkpoint/store.py trusts) before every rank exits 0 (for the stop-grace test).
Like the real loop it writes heartbeats, dumps its stack on SIGUSR2 and honours RECIPES_TEST_FAULT (for the restart
and hang-watchdog tests: recipes/train/heartbeat.py, recipes/train/faults.py).
"""
import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from recipes.config.loading import load_recipe
from recipes.train.faults import Fault
from recipes.train.heartbeat import Heartbeat, install_stack_dump


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args, overrides = ap.parse_known_args()
    install_stack_dump()
    heartbeat = Heartbeat.from_env()
    fault = Fault.from_env()
    recipe = load_recipe(args.config, overrides)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"{recipe.name}: ", flush=True)  # text chosen by the recipe (the hostile-strings test's name)
    steps, batch, seed = recipe.training.train_steps, recipe.training.global_batch, recipe.training.seed
    assert batch % world == 0, f"global batch {batch} not divisible by world size {world}"
    per_rank = batch // world

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, batch, 16, generator=g)
    y = torch.sin(x.sum(-1, keepdim=True))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    stop = [False]
    if os.environ.get("TOY_CKPT"):
        signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    for step in range(steps):
        heartbeat.beat(step, "data")
        if fault:
            fault.maybe_fire(rank, step + 1)
        heartbeat.beat(step, "forward-backward")
        xs = x[step, rank * per_rank:(rank + 1) * per_rank]
        ys = y[step, rank * per_rank:(rank + 1) * per_rank]
        loss = torch.nn.functional.mse_loss(model(xs), ys, reduction="sum") / batch
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        total = loss.detach().clone()
        dist.all_reduce(total)
        opt.step()
        losses.append(total.item())
        heartbeat.beat(step + 1, "log")
        print(f"step {step} loss {total.item():.8f} world {world} host {os.environ.get('LAUNCH_HOST', '?')}",
              flush=True)
        time.sleep(float(os.environ.get("TOY_STEP_SLEEP", "0")))
        if os.environ.get("TOY_CKPT"):
            flag = torch.tensor([1.0 if stop[0] else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                if rank == 0:
                    d = os.path.join(os.environ["TOY_CKPT"], f"step_{step + 1}")
                    os.makedirs(d, exist_ok=True)
                    torch.save(model.state_dict(), os.path.join(d, "model.pt"))
                    time.sleep(float(os.environ.get("TOY_SAVE_SECONDS", "0")))
                    with open(os.path.join(d, "complete.json"), "w") as f:
                        json.dump({"step": step + 1}, f)
                break
    heartbeat.beat(len(losses), "done")
    if rank == 0 and os.environ.get("TOY_OUT"):
        with open(os.environ["TOY_OUT"], "w") as f:
            json.dump({"world_size": world, "losses": losses, "name": recipe.name}, f)
    dist.barrier()  # leave together: no rank tears gloo down while a peer still talks to it
    dist.destroy_process_group()
    # and without C++ static destructors, where gloo's threads can still abort a finished rank under load
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

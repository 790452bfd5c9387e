"""Keep training when a node is gone for good (`--min-nodes N`): at a restart, the world becomes the nodes of the run
that answer over ssh (a node that answers again rejoins), never fewer than N.

What changes with the world: the model split stays (TP, CP, PP, VPP, EP: the checkpoint's layers stay where they
were per rank) and DP takes the difference; the global batch stays too (each DP rank runs more micro-batches per
step), so the tokens per step, the lr schedule and the data order are those of the run as planned. The new ranks
resume the newest complete checkpoint by resharding it on load (recipes.checkpoint.reshard). The launcher checks the
recipe for the new world as for the first one (layout, memory, batch divisibility, the checkpoint): what cannot run
there stops the run with the reason. The decisions are plain functions: the resize itself is `world_overrides`, the
supervisor (launch/supervise.py) applies it.
"""
from __future__ import annotations

from dataclasses import dataclass

from launch.common import LaunchError
from launch.hostfile import Node


@dataclass
class Resize:
    nodes: list[Node]     # the new world's nodes, in the run's node order
    rank_cmd: list[str]   # the ranks' command with the new world's overrides
    layout: str           # as the plan says it
    dp: int


def surviving(world_nodes: list[Node], reachable) -> list[Node]:
    """The run's nodes (its first world, in order) that answer now: the ones gone drop out, returning ones rejoin."""
    return [n for n in world_nodes if reachable(n.host)]


def world_overrides(parallel, nodes: list[Node]) -> tuple[list[str], int]:
    """The overrides that run the recipe on `nodes` with its model split kept: DP from the world, the cluster's node
    count. LaunchError when the world does not hold whole replicas of the split."""
    world = sum(n.slots for n in nodes)
    replica = parallel.tp * parallel.cp * parallel.pp
    if world % replica:
        raise LaunchError(f"{len(nodes)} node(s) with {world} ranks do not hold whole model replicas of TP x CP x PP "
                          f"= {parallel.tp} x {parallel.cp} x {parallel.pp} = {replica}")
    return [f"cluster.nodes={len(nodes)}", f"parallel.dp={world // replica}"], world // replica


def describe(old_layout: str, new: Resize, hosts_before: list[str], global_batch: int, seq: int) -> dict:
    """The restart record's account of the change."""
    gone = [h for h in hosts_before if h not in [n.host for n in new.nodes]]
    back = [n.host for n in new.nodes if n.host not in hosts_before]
    why = "; ".join(filter(None, [f"gone: {' '.join(gone)}" if gone else "", f"back: {' '.join(back)}" if back else ""]))
    return {"why": why, "from": old_layout, "to": new.layout, "nodes": len(new.nodes), "dp": new.dp,
            "global_batch": global_batch, "tokens_per_step": global_batch * seq}

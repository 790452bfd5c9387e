"""torchrun's flags for node i: a static rendezvous (node rank, master address and port), no restarts of its own (the
supervisor restarts the whole job), the per-rank program run as given (--no-python)."""
from __future__ import annotations

from launch.backends.base import Launch


def devices_env(launch: Launch, i: int) -> list[str]:
    n = launch.nodes[i]
    return [] if n.devices == list(range(n.slots)) else [f"CUDA_VISIBLE_DEVICES={','.join(map(str, n.devices))}"]


def args(launch: Launch, i: int, monitor: bool = True) -> list[str]:
    n = launch.nodes[i]
    out = [launch.torchrun(), f"--nnodes={len(launch.nodes)}", f"--node_rank={i}", f"--nproc_per_node={n.slots}",
           f"--master_addr={launch.plan.master_addr}", f"--master_port={launch.master_port}", "--max_restarts=0"]
    return out + (["--monitor_interval=0.5"] if monitor else []) + ["--no-python"]

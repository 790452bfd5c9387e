"""The node plan of a launch: which hosts, how many ranks (slots) and which devices on each, in node order; the world
size; the rendezvous address; the spares kept out of the world. Under Slurm without a hostfile the nodes are only
counted (Slurm names them when the job starts). Every refusal here happens before a log dir exists."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from launch.common import LaunchError
from launch.hostfile import HostfileError, Node, parse_hostfile, select_nodes
from launch.options import Options


@dataclass
class NodePlan:
    nodes: list[Node]
    master_addr: str = ""
    spares: list[Node] = field(default_factory=list)
    slurm_picks: bool = False        # the hosts are unknown until the job starts (their names are "")

    @property
    def hosts(self) -> list[str]:
        return [n.host for n in self.nodes]

    @property
    def world_size(self) -> int:
        return sum(n.slots for n in self.nodes)

    def rank_range(self, i: int) -> tuple[int, int]:
        first = sum(n.slots for n in self.nodes[:i])
        return first, first + self.nodes[i].slots - 1


def _local_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU"))


def select(opts: Options, gpus_per_node: int = 0) -> list[Node]:
    """The selected nodes: for Slurm without a hostfile `--nodes` unnamed ones with `--gpus-per-node` ranks each
    (else `gpus_per_node`, the recipe's); localhost for a run without hostfile; else the hostfile narrowed by the
    flags."""
    if opts.backend == "slurm" and not opts.hostfile:
        return [Node("", opts.gpus_per_node or gpus_per_node) for _ in range(opts.nodes)]
    if not opts.hostfile:
        return [Node("localhost", opts.num_gpus or _local_gpus() or 1)]
    try:
        return select_nodes(parse_hostfile(opts.hostfile), opts.include, opts.exclude, opts.num_nodes, opts.num_gpus)
    except HostfileError as e:
        raise LaunchError(f"hostfile error:\n{e}", 2) from None


def check_shape(nodes: list[Node], backend: str) -> None:
    hosts = " ".join(n.host for n in nodes)
    if backend == "local" and len(nodes) > 1:
        raise LaunchError(f"--backend local runs on one node but the selection has {len(nodes)} hosts ({hosts}); add "
                          "--num-nodes 1 or use another backend", 2)
    # torchrun and srun give every node the same number of ranks; DeepSpeed's runner copes with uneven nodes.
    if backend != "deepspeed" and len({n.slots for n in nodes}) > 1:
        raise LaunchError(f"backend {backend} needs the same slots on every host (got "
                          f"{' '.join(str(n.slots) for n in nodes)}); use --num-gpus N or --backend deepspeed", 2)


def split_spares(nodes: list[Node], k: int, backend: str) -> tuple[list[Node], list[Node]]:
    """--spares K: the last K hosts of the selection wait outside the world until a host that failed twice needs
    replacing."""
    if k <= 0:
        return nodes, []
    if backend == "local":
        raise LaunchError("--spares needs hosts to swap in: use a hostfile with --backend torchrun-ssh or deepspeed", 2)
    if k >= len(nodes):
        raise LaunchError(f"--spares {k} leaves no host to train on: the selection has {len(nodes)} host(s) "
                          f"({' '.join(n.host for n in nodes)})", 2)
    return nodes[:-k], nodes[-k:]

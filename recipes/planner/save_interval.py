"""How often a run should save: the Young/Daly optimum between the cost of a save and the work a failure loses.

    interval = sqrt(2 x save_time x MTBF)        (Young 1974; Daly 2006, first order)

MTBF is the whole job's: one node failing stops every rank, so MTBF = 1 / (nodes x failures per node per day). The
per-node rate and the write bandwidth come from the cluster preset (configs/clusters/*.yaml, where each says its
source); without them, the figures of Llama 3's pre-training (Dubey et al. 2024, "The Llama 3 Herd of Models",
section 3.3.4) are used and the plan says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from recipes.planner.units import format_duration

# Llama 3 405B pre-training: 466 job interruptions in a 54-day snapshot on 16,384 H100 GPUs = 2,048 nodes of 8.
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_NODES = 466, 54, 16_384 // 8
LLAMA3_FAILURES_PER_NODE_DAY = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * LLAMA3_NODES)  # 0.00421
# Its checkpoint storage (Tectonic) sustains 2 TB/s for those 2,048 nodes: about 1 GB/s per node.
LLAMA3_WRITE_GBPS_PER_NODE = 2000 / LLAMA3_NODES
# A DeepSpeed checkpoint holds per parameter the bf16 weights (2 bytes) and the fp32 master copy and Adam's two
# moments (12 bytes), written by all ranks at once.
CHECKPOINT_BYTES_PER_PARAM = 14


@dataclass(frozen=True)
class SaveInterval:
    steps: int
    interval_s: float
    save_s: float
    mtbf_s: float
    checkpoint_bytes: float
    write_gbps: float  # all nodes together
    failures_per_node_day: float
    nodes: int
    step_s: float
    sources: tuple[str, ...] = ()  # the figures that came from Llama 3 rather than the cluster preset

    def describe(self) -> str:
        """The numbers used, one line."""
        text = (f"checkpoint.save_interval = {self.steps} steps (every {format_duration(self.steps * self.step_s)}): "
                f"Young/Daly sqrt(2 x save {format_duration(self.save_s)} x MTBF {format_duration(self.mtbf_s)}) = "
                f"{format_duration(self.interval_s)} at {self.step_s:.2f} s per step; save = checkpoint "
                f"{self.checkpoint_bytes / 1e9:,.0f} GB ({CHECKPOINT_BYTES_PER_PARAM} bytes per parameter) / "
                f"{self.write_gbps:g} GB/s; MTBF = 1 / ({self.nodes} nodes x {self.failures_per_node_day:.5f} "
                f"failures per node-day)")
        if self.sources:
            text += f"; {' and '.join(self.sources)} not set in the cluster preset: Llama 3's figure used"
        return text


def young_daly_seconds(save_s: float, mtbf_s: float) -> float:
    return math.sqrt(2 * save_s * mtbf_s)


def save_interval(params: float, cluster, step_s: float) -> SaveInterval:
    """The save interval (in whole steps, at least 1) for a model of `params` parameters on `cluster` at `step_s`
    seconds per step."""
    sources = []
    rate = cluster.node_failures_per_day
    if rate is None:
        rate = LLAMA3_FAILURES_PER_NODE_DAY
        sources.append("cluster.node_failures_per_day")
    per_node = cluster.checkpoint_write_gbps_per_node
    if per_node is None:
        per_node = LLAMA3_WRITE_GBPS_PER_NODE
        sources.append("cluster.checkpoint_write_gbps_per_node")
    write_gbps = per_node * cluster.nodes
    size = params * CHECKPOINT_BYTES_PER_PARAM
    save_s = size / (write_gbps * 1e9)
    mtbf_s = 86400 / (cluster.nodes * rate)
    interval = young_daly_seconds(save_s, mtbf_s)
    return SaveInterval(steps=max(1, round(interval / step_s)), interval_s=interval, save_s=save_s, mtbf_s=mtbf_s,
                        checkpoint_bytes=size, write_gbps=write_gbps, failures_per_node_day=rate,
                        nodes=cluster.nodes, step_s=step_s, sources=tuple(sources))

"""Collective costs: the one ring formula (`ring_seconds`, nccl-tests PERFORMANCE.md) and the process groups of a
layout as `Link`s (ranks, bus bandwidth, latency per ring step) that every communication term prices with."""
from __future__ import annotations

import math
from dataclasses import dataclass

from recipes.parallel.layout import Layout
from recipes.planner.assumptions import Assumptions


def ring_seconds(bytes_: float, n: int, bus_gbps: float, kind: str, *, step_latency_s: float = 0.0,
                 chunk_bytes: float | None = None, calls: float | None = None) -> float:
    """Seconds for a ring collective of `bytes_` over n ranks at `bus_gbps` GB/s bus bandwidth (nccl-tests:
    all-reduce (S/B) 2(n-1)/n, reduce-scatter and all-gather (S/B)(n-1)/n), issued in calls of `chunk_bytes` (or
    `calls` calls), each call paying one latency per ring step (2(n-1) steps for all-reduce, n-1 otherwise)."""
    if n <= 1 or bytes_ <= 0:
        return 0.0
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    if calls is None:
        calls = math.ceil(bytes_ / chunk_bytes) if chunk_bytes else 1
    return bytes_ / (bus_gbps * 1e9) * steps / n + calls * steps * step_latency_s


def group_bus_gbps(cluster, assume: Assumptions, members_per_node: int, spans_nodes: bool) -> float:
    """Bus bandwidth of one collective group. Inside a node: NVLink. Across nodes: the node's NICs, shared by the
    gpus_per_node / members_per_node groups of this kind that run at the same time."""
    intra = cluster.intra_node_gbps * assume.intra_link_efficiency
    if not spans_nodes:
        return intra
    inter = cluster.inter_node_gbps * assume.inter_link_efficiency * members_per_node / cluster.gpus_per_node
    return min(intra, inter)


@dataclass(frozen=True)
class Link:
    """One process group's collectives: n ranks at bus_gbps, latency_s per ring step (`ring_seconds`)."""
    n: int
    bus_gbps: float
    latency_s: float

    def seconds(self, nbytes: float, kind: str, calls: float = 1.0) -> float:
        return ring_seconds(nbytes, self.n, self.bus_gbps, kind, step_latency_s=self.latency_s, calls=calls)


def strided_link(cluster, n: int, stride: int, assume: Assumptions) -> Link:
    """A group of n ranks `stride` global ranks apart (rank order TP, CP, DP, PP: a CP group is TP apart, the data
    axis DP x CP too). Across nodes each member gets its share of the node's NICs: every GPU of a node is in a group
    of this kind, all of them communicating at once."""
    gpn = cluster.gpus_per_node
    per_node = max(1, min(n, gpn // stride)) if stride <= gpn else 1
    spans = stride * n > gpn
    return Link(n, group_bus_gbps(cluster, assume, per_node, spans),
                assume.latency_inter_s if spans else assume.latency_intra_s)


def tp_link(cluster, layout: Layout, assume: Assumptions) -> Link:
    t = layout.tp
    spans = t > cluster.gpus_per_node
    return Link(t, group_bus_gbps(cluster, assume, min(t, cluster.gpus_per_node), spans),
                assume.latency_inter_s if spans else assume.latency_intra_s)


def dp_link(cluster, layout: Layout, assume: Assumptions) -> Link:
    """The data axis DeepSpeed reduces gradients and shards ZeRO over: DP x CP ranks, TP apart."""
    return strided_link(cluster, layout.data_axis, layout.tp, assume)


def cp_link(cluster, layout: Layout, assume: Assumptions) -> Link:
    return strided_link(cluster, layout.cp, layout.tp, assume)


def nvlink_vs_nic(cluster, assume: Assumptions) -> tuple[float, float]:
    """(NVLink, a GPU's share of its node's NICs) as bus bandwidth in GB/s, both as priced: the datasheet NVLink
    figure counts both directions (900 GB/s on an H100 = 450 each way), a NIC's line rate one (400 Gb/s = 50 GB/s
    each way); each is scaled by its link efficiency, which the calibrations fit on that basis."""
    return (cluster.intra_node_gbps * assume.intra_link_efficiency,
            cluster.inter_node_gbps * assume.inter_link_efficiency / cluster.gpus_per_node)

"""Geometry of the layered cluster drawing, computed from a placement-core `Topology`.

Tiers from top to bottom: core switches, spines, leaves, then nodes side by side, each node's
GPUs in a small grid inside its NVLink domain box, and one NIC marker per NIC wired to its leaf.
The x axis is in "GPU slots" (one slot per GPU column); y values are fixed per tier. Pure numpy,
no Django, so the figure builders and their tests stay fast at 16k GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from apps.placement.topology import Topology

# Tier heights on the y axis.
Y_CORE = 5.6
Y_SPINE = 4.4
Y_LEAF = 3.2
Y_NIC = 1.75
Y_NODE = 1.5
Y_GPU_TOP = 1.2
GPU_ROW_STEP = 0.28
BOX_PAD = 0.15
NODE_GAP = 0.6  # slots between two nodes
GROUP_GAP = 3.0  # extra slots between nodes of different leaves
Y_AGG = 0.9  # the aggregated per-leaf markers sit in the GPU band


@dataclass(frozen=True, eq=False)
class Segment:
    """A straight line between two points of the drawing."""

    x0: float
    y0: float
    x1: float
    y1: float


@dataclass(frozen=True, eq=False)
class ClusterLayout:
    """Positions for every element of the drawing. Arrays are indexed like the topology's:
    GPUs by gid, nodes by node index, leaves by leaf index; NICs are numbered node by node."""

    topology: Topology
    gpu_x: np.ndarray
    gpu_y: np.ndarray
    node_x: np.ndarray  # centre of each node
    node_x0: np.ndarray  # left edge of each node's box
    node_x1: np.ndarray  # right edge
    node_y0: np.ndarray  # bottom edge of each node's box
    nic_x: np.ndarray  # per NIC, NICs numbered node by node in file order
    nic_node: np.ndarray  # node index of each NIC
    nic_rail: np.ndarray  # index of the NIC on its node
    nic_leaf: np.ndarray  # leaf index of each NIC
    nic_names: tuple[str, ...]
    gpu_nic: np.ndarray  # NIC number of each GPU, -1 when standalone
    switch_x: dict[str, float]
    switch_y: dict[str, float]
    switch_tier: dict[str, str]
    uplinks: tuple[tuple[str, str, float, float], ...]  # (lower, upper, bw_GBps, latency_us)
    group_of_node: np.ndarray  # aggregation group of each node
    group_names: tuple[str, ...]
    group_x: np.ndarray
    group_leaves: tuple[tuple[int, ...], ...]  # leaf indices each group's NICs reach
    width: float
    rail_optimized: bool

    @property
    def n_nics(self) -> int:
        return int(self.nic_x.shape[0])

    def wire_segment(self, nic: int) -> Segment:
        """The NIC-to-leaf cable of NIC number `nic`."""
        leaf = self.topology.leaf_names[int(self.nic_leaf[nic])]
        return Segment(float(self.nic_x[nic]), Y_NIC, self.switch_x[leaf], Y_LEAF)

    def uplink_segment(self, i: int) -> Segment:
        """The switch-to-switch cable number `i` of `uplinks`."""
        lo, hi, _, _ = self.uplinks[i]
        return Segment(self.switch_x[lo], self.switch_y[lo], self.switch_x[hi], self.switch_y[hi])


def gpu_grid(gpus: int) -> tuple[int, int]:
    """(columns, rows) of a node's GPU grid: roughly twice as tall as wide, at most 4 rows."""
    cols = max(1, math.ceil(math.sqrt(gpus / 2)))
    rows = math.ceil(gpus / cols)
    if rows > 4:
        rows, cols = 4, math.ceil(gpus / 4)
    return cols, max(rows, 1)


def _spread(order_keys: list[float], width: float) -> np.ndarray:
    """Evenly spaced x positions over [0, width] for items, assigned in order of their keys."""
    n = len(order_keys)
    out = np.empty(n)
    if n == 0:
        return out
    order = np.argsort(np.asarray(order_keys, dtype=float), kind="stable")
    step = width / n
    out[order] = step * (np.arange(n) + 0.5)
    return out


NIC_MIN_GAP = 0.3  # slots: NIC markers of one node closer than this are spread over the node


def _nic_positions(xs: list[float], x0: float, x1: float) -> list[float]:
    """A node's NIC marker positions: above their GPUs (the mean x of the GPUs each serves), or,
    when two would sit closer than NIC_MIN_GAP (one NIC per GPU of a grid two columns wide puts
    four on one spot), spread evenly over the node's box in that order, so none overlaps."""
    n = len(xs)
    if n < 2:
        return list(xs)
    order = sorted(range(n), key=lambda k: (xs[k], k))
    if min(xs[b] - xs[a] for a, b in zip(order, order[1:], strict=False)) >= NIC_MIN_GAP:
        return list(xs)
    step = (x1 - x0) / n
    out = [0.0] * n
    for j, k in enumerate(order):
        out[k] = x0 + step * (j + 0.5)
    return out


def cluster_layout(topo: Topology) -> ClusterLayout:
    """Lay a topology out as a layered graph (positions only; see the module docstring)."""
    n_nodes = len(topo.nodes)
    gpu_x = np.empty(topo.n_gpus)
    gpu_y = np.empty(topo.n_gpus)
    node_x0 = np.empty(n_nodes)
    node_x1 = np.empty(n_nodes)
    node_y0 = np.empty(n_nodes)
    cursor = 0.0
    prev_leaf = None
    for i, node in enumerate(topo.nodes):
        leaf = int(topo.node_leaf[i])
        if prev_leaf is not None and leaf != prev_leaf:
            cursor += GROUP_GAP
        prev_leaf = leaf
        cols, rows = gpu_grid(node.gpus)
        first = int(topo.node_first_gid[i])
        k = np.arange(node.gpus)
        gpu_x[first : first + node.gpus] = cursor + 0.5 + (k % cols)
        gpu_y[first : first + node.gpus] = Y_GPU_TOP - GPU_ROW_STEP * (k // cols)
        node_x0[i] = cursor + 0.05
        node_x1[i] = cursor + cols - 0.05
        node_y0[i] = Y_GPU_TOP - GPU_ROW_STEP * (rows - 1) - BOX_PAD
        cursor += cols + NODE_GAP
    width = max(cursor - NODE_GAP, 1.0)
    node_x = (node_x0 + node_x1) / 2

    nic_x: list[float] = []
    nic_node: list[int] = []
    nic_rail: list[int] = []
    nic_leaf: list[int] = []
    nic_names: list[str] = []
    gpu_nic = np.full(topo.n_gpus, -1, dtype=np.int64)
    for i, node in enumerate(topo.nodes):
        first = int(topo.node_first_gid[i])
        own_x = []
        for k, nic in enumerate(node.nics):
            gids = np.asarray(nic.gpus, dtype=np.int64) + first
            gpu_nic[gids] = len(nic_x) + k
            own_x.append(float(gpu_x[gids].mean()) if gids.size else float(node_x[i]))
        nic_x.extend(_nic_positions(own_x, float(node_x0[i]), float(node_x1[i])))
        for k, nic in enumerate(node.nics):
            nic_node.append(i)
            nic_rail.append(k)
            nic_leaf.append(topo.leaf_by_name[nic.leaf])
            nic_names.append(nic.name)
    nic_x_arr = np.asarray(nic_x, dtype=float)
    nic_leaf_arr = np.asarray(nic_leaf, dtype=np.int64)

    switch_tier = {s.name: s.tier for s in topo.switches}
    switch_x: dict[str, float] = {}
    switch_y: dict[str, float] = {}
    # Leaves: ordered by where their NICs are, then spread evenly over the width.
    leaf_keys = []
    for li, _name in enumerate(topo.leaf_names):
        sel = nic_leaf_arr == li
        leaf_keys.append(float(nic_x_arr[sel].mean()) if sel.any() else width * 2 + li)
    for name, x in zip(topo.leaf_names, _spread(leaf_keys, width), strict=True):
        switch_x[name], switch_y[name] = float(x), Y_LEAF

    # Parallel cables between one pair of switches are drawn once, with their capacities summed.
    merged: dict[tuple[str, str], list[float]] = {}
    tier_rank = {"leaf": 0, "spine": 1, "core": 2}
    for lk in topo.links:
        lo, hi = (lk.a, lk.b) if tier_rank[switch_tier[lk.a]] < tier_rank[switch_tier[lk.b]] else (lk.b, lk.a)
        entry = merged.setdefault((lo, hi), [0.0, 0.0, 0])
        entry[0] += lk.bw_GBps
        entry[1] += lk.latency_us
        entry[2] += 1
    uplinks = tuple((lo, hi, bw, lat / k) for (lo, hi), (bw, lat, k) in merged.items())

    for tier, y in (("spine", Y_SPINE), ("core", Y_CORE)):
        names = [s.name for s in topo.switches if s.tier == tier]
        keys = []
        for n in names:
            below = [switch_x[lo] for lo, hi, _, _ in uplinks if hi == n and lo in switch_x]
            keys.append(float(np.mean(below)) if below else width * 2)
        for name, x in zip(names, _spread(keys, width), strict=True):
            switch_x[name], switch_y[name] = float(x), y

    # Aggregation groups: the nodes whose first NIC sits on one leaf (standalone nodes together).
    group_index: dict[int, int] = {}
    group_names: list[str] = []
    group_of_node = np.empty(n_nodes, dtype=np.int64)
    for i in range(n_nodes):
        leaf = int(topo.node_leaf[i])
        if leaf not in group_index:
            group_index[leaf] = len(group_names)
            group_names.append(f"{topo.leaf_names[leaf]} nodes" if leaf >= 0 else "standalone nodes")
        group_of_node[i] = group_index[leaf]
    n_groups = len(group_names)
    group_x = np.bincount(group_of_node, weights=node_x, minlength=n_groups) / np.bincount(
        group_of_node, minlength=n_groups
    )
    group_leaf_sets: list[set[int]] = [set() for _ in range(n_groups)]
    nic_node_arr = np.asarray(nic_node, dtype=np.int64)
    if nic_node_arr.size:
        for g, leaf in set(zip(group_of_node[nic_node_arr].tolist(), nic_leaf, strict=True)):
            group_leaf_sets[g].add(leaf)
    rails = set(nic_rail)
    rail_optimized = len(rails) > 1 and any(len({c.leaf for c in node.nics}) > 1 for node in topo.nodes)
    return ClusterLayout(
        topology=topo,
        gpu_x=gpu_x,
        gpu_y=gpu_y,
        node_x=node_x,
        node_x0=node_x0,
        node_x1=node_x1,
        node_y0=node_y0,
        nic_x=nic_x_arr,
        nic_node=nic_node_arr,
        nic_rail=np.asarray(nic_rail, dtype=np.int64),
        nic_leaf=nic_leaf_arr,
        nic_names=tuple(nic_names),
        gpu_nic=gpu_nic,
        switch_x=switch_x,
        switch_y=switch_y,
        switch_tier=switch_tier,
        uplinks=uplinks,
        group_of_node=group_of_node,
        group_names=tuple(group_names),
        group_x=group_x,
        group_leaves=tuple(tuple(sorted(s)) for s in group_leaf_sets),
        width=width,
        rail_optimized=rail_optimized,
    )

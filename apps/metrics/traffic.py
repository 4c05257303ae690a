"""What a placed job's prediction says each rank sends over the network (no Django): the rate over
its NIC and the part of it that leaves the NIC's leaf, in GB/s.

Each priced group beyond NVLink sends, per member, at its bottleneck for its time per step,
averaged over the step (the dashboard's predicted link loads read the same figures). Of a member's
rate in a group that crosses leaves (level spine or core), the share that leaves its leaf is the
share of the job's GPUs under other leaves; a group within one leaf keeps all of its NIC traffic
under the leaf. Measured NIC counters times these shares give the measured load attributed to a
leaf's uplinks: traffic that stays inside a leaf is never charged to them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from apps.placement.topology import Topology

OFF_LEAF_LEVELS = frozenset({"spine", "core"})


def _field(group: Any, name: str):
    return group.get(name) if isinstance(group, dict) else getattr(group, name, None)


def rank_network_rates(
    topology: Topology, gids: Sequence[int], groups: Iterable[Any], step_ms: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """(per rank: predicted send rate over its NIC, the part of it that leaves its leaf), GB/s.
    `groups` are the prediction's priced groups (placement-output dicts or `GroupCost`s: group,
    ranks, level, bottleneck_GBps, time_ms); zeros without a finite step time."""
    n = len(gids)
    nic = np.zeros(n)
    off = np.zeros(n)
    if n == 0 or step_ms is None or not math.isfinite(step_ms) or step_ms <= 0:
        return nic, off
    leaf = topology.gpu_leaf[np.asarray(gids, dtype=np.int64)]
    on_leaf = np.bincount(leaf[leaf >= 0], minlength=len(topology.leaf_names))
    for group in groups:
        level, time_ms, bw = (
            _field(group, "level"),
            _field(group, "time_ms"),
            _field(group, "bottleneck_GBps"),
        )
        if level not in ("leaf", *OFF_LEAF_LEVELS) or not time_ms or not bw:
            continue
        if not (math.isfinite(time_ms) and math.isfinite(bw)):
            continue
        rate = float(bw) * min(1.0, float(time_ms) / step_ms)
        ranks = [int(r) for r in _field(group, "ranks") or () if 0 <= int(r) < n]
        nic[ranks] += rate
        if level in OFF_LEAF_LEVELS:
            for r in ranks:
                if leaf[r] >= 0:
                    off[r] += rate * (n - on_leaf[leaf[r]]) / n
    return nic, off


def nic_first(topology: Topology) -> np.ndarray:
    """Per node, the number of its first NIC (NICs numbered node by node in file order, as the
    dashboard's layout numbers them); one more entry, the number of NICs."""
    counts = [len(node.nics) for node in topology.nodes]
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def nic_off_leaf_shares(
    topology: Topology, jobs: Iterable[tuple[Sequence[int], Mapping | None]]
) -> tuple[np.ndarray, np.ndarray]:
    """Per NIC (numbered as `nic_first` says): (predicted send rate, the part of it leaving its
    leaf), GB/s, summed over the jobs given as (gids, the placement output's `predicted` block)."""
    first = nic_first(topology)
    total = np.zeros(int(first[-1]))
    leaving = np.zeros(int(first[-1]))
    for gids, predicted in jobs:
        if not predicted or not gids:
            continue
        nic, off = rank_network_rates(topology, gids, predicted.get("groups") or (), predicted.get("step_ms"))
        g = np.asarray(gids, dtype=np.int64)
        node, rail = topology.gpu_node[g], topology.gpu_rail[g]
        ok = (nic > 0) & (rail >= 0)
        at = first[node[ok]] + rail[ok]
        np.add.at(total, at, nic[ok])
        np.add.at(leaving, at, off[ok])
    return total, leaving

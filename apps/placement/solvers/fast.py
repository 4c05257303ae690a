"""Link-aware candidate sets: the job split evenly over the nodes with the fastest network per GPU.

Best fit counts free GPUs; it cannot tell two whole nodes whose 8 GPUs share one NIC from 8-NIC
nodes with 5 free GPUs each. These sets are priced beside the best-fit ones, so the cost model
chooses: for each split of the job into k equal per-node parts (the largest parts first), the k
nodes with room for a part and the highest NIC rate per free GPU (distinct NICs serving their free
GPUs, GB/s, over the free GPU count), ties to the quieter unit and then hierarchy order, so that
equal nodes stay together under as few leaves as possible.
"""

from __future__ import annotations

import numpy as np

from ..costmodel.paths import nic_ids
from ..jobs import JobSpec
from ..topology import Topology
from .base import HierarchyIndex
from .blocks import Free, canonical

# Splits (per-node part sizes) tried, largest parts first.
SPLITS_TRIED = 3


def node_rates(topology: Topology, counts: Free) -> np.ndarray:
    """Per node: the summed rate (GB/s) of the distinct NICs serving its free GPUs, per free GPU."""
    ids, _ = nic_ids(topology)
    net = counts.ids[topology.gpu_nic_bw[counts.ids] > 0]
    _, first = np.unique(ids[net], return_index=True)
    served = net[first]
    total = np.bincount(
        topology.gpu_node[served], weights=topology.gpu_nic_bw[served], minlength=counts.node.size
    )
    return total / np.maximum(counts.node, 1)


def fast_sets(topology: Topology, idx: HierarchyIndex, counts: Free, job: JobSpec) -> list[np.ndarray]:
    """GPU sets (canonical order) of the job split evenly over the fastest nodes, one per split;
    then split near-evenly (parts of two sizes one apart, 7 + 7 + 6 + 6 + 6): a hierarchical
    allreduce's network phase moves each node's share through as many NICs as the node has ranks,
    so its smallest part decides, and best fit's whole nodes and a remainder (8 + 8 + 8 + 4 + 4)
    lose to an even spread where no equal split fits."""
    n = job.gpus
    rate = node_rates(topology, counts)
    out: list[np.ndarray] = []
    for per in range(min(n, idx.max_node_gpus), 0, -1):
        if len(out) >= SPLITS_TRIED:
            break
        if n % per or _cuts_tp(per, job):
            continue
        pick = _fastest(idx, counts, rate, per)[: n // per]
        if pick.size < n // per or n // per < 2:
            continue
        out.append(_take(idx, counts, pick, np.full(pick.size, per)))
    near = 0
    first = max(2, -(-n // idx.max_node_gpus))
    for k in range(first, min(n, 2 * first) + 1):
        if near >= SPLITS_TRIED:
            break
        lo, extra = divmod(n, k)
        if not extra or _cuts_tp(lo, job) or _cuts_tp(lo + 1, job):
            continue
        pick = _fastest(idx, counts, rate, lo)[:k]
        roomy = pick[counts.node[pick] > lo][:extra]
        if pick.size < k or roomy.size < extra:
            continue
        out.append(_take(idx, counts, pick, lo + np.isin(pick, roomy)))
        near += 1
    return out


def _cuts_tp(part: int, job: JobSpec) -> bool:
    """Whether a per-node part of `part` GPUs neither holds whole TP groups nor divides one."""
    return bool(part % job.tp and job.tp % part)


def _fastest(idx: HierarchyIndex, counts: Free, rate: np.ndarray, part: int) -> np.ndarray:
    """Nodes with room for `part` GPUs, the highest NIC rate per free GPU first, ties to the
    quieter unit, then hierarchy order."""
    ok = np.flatnonzero(counts.node >= part)
    unit = idx.gpu_unit[idx.node_first_gid[ok]]
    return ok[np.lexsort((idx.position[idx.node_first_gid[ok]], unit, counts.unit_load[unit], -rate[ok]))]


def _take(idx: HierarchyIndex, counts: Free, nodes: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Each node's `parts` lowest free GPUs, in canonical order."""
    start = np.searchsorted(counts.ids, idx.node_first_gid[nodes])
    return canonical(idx, np.concatenate([counts.ids[s : s + p] for s, p in zip(start, parts, strict=True)]))


def rate_filled_set(topology: Topology, idx: HierarchyIndex, counts: Free, job: JobSpec) -> np.ndarray | None:
    """The job's GPUs taken by the network rate each would get: the k-th free GPU behind a NIC is
    worth the NIC's rate over k, and the job takes the best-served GPUs, among equals those of
    the nodes with the higher rate per free GPU (`node_rates`), then the quieter unit, then the
    fuller node, then hierarchy order. So 8-NIC nodes with 5 free GPUs come before whole nodes
    whose GPUs share one NIC, and what they cannot hold goes one GPU per 1-NIC node. A 4-NIC
    node's first GPU behind each NIC is worth as much as an 8-NIC node's GPU, but taking it
    leaves its NIC partner out (on a DGX-1 cube mesh, GPUs 0, 2, 4 and 6 hold no NVLink island
    of 4): the 8-NIC nodes, whose GPUs a group can take whole, come first.
    None when every free node has the same rate per free GPU (best fit covers that already)."""
    n = job.gpus
    rate = node_rates(topology, counts)
    nodes = np.flatnonzero((counts.node > 0) & (rate > 0))
    if nodes.size < 2 or np.ptp(rate[nodes]) <= 1e-9 * rate[nodes].max():
        return None
    gids = counts.ids[topology.gpu_nic_bw[counts.ids] > 0]
    if gids.size < n:
        return None
    ids, _ = nic_ids(topology)
    nic = ids[gids]
    by_nic = np.argsort(nic, kind="stable")
    starts = np.flatnonzero(np.r_[True, nic[by_nic][1:] != nic[by_nic][:-1]])
    behind = np.empty(gids.size, dtype=np.int64)
    behind[by_nic] = np.arange(gids.size) - np.repeat(starts, np.diff(np.r_[starts, gids.size]))
    worth = topology.gpu_nic_bw[gids] / (behind + 1)
    node = idx.gpu_node[gids]
    unit = idx.gpu_unit[gids]
    order = np.lexsort(
        (
            idx.position[gids],
            idx.position[idx.node_first_gid[node]],
            -counts.node[node],
            unit,
            counts.unit_load[unit],
            -np.round(rate[node], 9),
            -np.round(worth, 9),
        )
    )
    return canonical(idx, gids[order[:n]])

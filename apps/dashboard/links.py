"""Every link of the cluster drawing with its capacity and predicted load, in GB/s.

Links: each NIC's cable to its leaf, the bundled trunk of one leaf group's cables to one leaf
(what the zoomed-out graph draws), leaf-spine and spine-core uplinks (parallel cables merged, as
the layout draws them). Predicted load comes from the jobs' `net_rates` (each GPU's mean send
rate per level its groups cross): a GPU's rate loads its NIC; the share of its group under other
leaves loads its leaf's uplinks, spread over them by capacity (ECMP); the share in other pods
loads its pod's spine-core uplinks the same way. No Django: measured values are merged by the
client.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from apps.dashboard.jobview import JobView
from apps.dashboard.layout import ClusterLayout


@dataclass(frozen=True, eq=False)
class LinkLoads:
    """Capacities and predicted loads (GB/s), and each link's jobs as {job index: GB/s}.

    NICs are numbered as in the layout; trunks are `trunks` (group, leaf index) pairs; uplinks
    are `layout.uplinks`."""

    nic_cap: np.ndarray
    nic_load: np.ndarray
    nic_jobs: dict[int, dict[int, float]]
    trunks: tuple[tuple[int, int], ...]
    trunk_nics: tuple[tuple[int, ...], ...]
    trunk_cap: np.ndarray
    trunk_load: np.ndarray
    trunk_jobs: list[dict[int, float]]
    up_cap: np.ndarray
    up_load: np.ndarray
    up_jobs: list[dict[int, float]]


def _spread(load: dict[int, float], jobs: dict[int, dict[int, float]], members: dict, caps: np.ndarray):
    """Split each switch's load (and its jobs) over its links by capacity share."""
    n = caps.shape[0]
    out = np.zeros(n)
    out_jobs: list[dict[int, float]] = [{} for _ in range(n)]
    for key, links in members.items():
        total = float(caps[links].sum())
        if total <= 0 or key not in load:
            continue
        for i in links:
            share = float(caps[i]) / total
            out[i] += load[key] * share
            out_jobs[i] = {j: v * share for j, v in jobs.get(key, {}).items()}
    return out, out_jobs


def link_loads(lay: ClusterLayout, jobs: Sequence[JobView]) -> LinkLoads:
    """Capacity and predicted load of every link (see the module docstring)."""
    topo = lay.topology
    nic_cap = np.array([nic.bw_GBps for node in topo.nodes for nic in node.nics], dtype=float)
    nic_load = np.zeros(lay.n_nics)
    nic_jobs: dict[int, dict[int, float]] = defaultdict(dict)
    leaf_load: dict[int, float] = defaultdict(float)
    leaf_jobs: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    pod_load: dict[int, float] = defaultdict(float)
    pod_jobs: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for j, job in enumerate(jobs):
        if not job.net_rates:
            continue
        g = np.asarray(job.gids, dtype=np.int64)
        leaves, leaf_count = np.unique(topo.gpu_leaf[g], return_counts=True)
        on_leaf = dict(zip(leaves.tolist(), leaf_count.tolist(), strict=True))
        pods, pod_count = np.unique(topo.gpu_pod[g], return_counts=True)
        in_pod = dict(zip(pods.tolist(), pod_count.tolist(), strict=True))
        n = g.size
        for gid, level, rate in job.net_rates:
            nic = int(lay.gpu_nic[gid])
            if nic >= 0:
                nic_load[nic] += rate
                nic_jobs[nic][j] = nic_jobs[nic].get(j, 0.0) + rate
            leaf = int(topo.gpu_leaf[gid])
            if level in ("spine", "core") and leaf >= 0:
                off = rate * (n - on_leaf[leaf]) / n
                leaf_load[leaf] += off
                leaf_jobs[leaf][j] += off
            pod = int(topo.gpu_pod[gid])
            if level == "core" and pod >= 0:
                off = rate * (n - in_pod[pod]) / n
                pod_load[pod] += off
                pod_jobs[pod][j] += off

    # Trunks: the cables of one leaf group's NICs to one leaf, drawn as one bundle.
    trunk_index: dict[tuple[int, int], list[int]] = {}
    for nic in range(lay.n_nics):
        key = (int(lay.group_of_node[lay.nic_node[nic]]), int(lay.nic_leaf[nic]))
        trunk_index.setdefault(key, []).append(nic)
    trunks = tuple(trunk_index)
    trunk_nics = tuple(tuple(v) for v in trunk_index.values())
    trunk_cap = np.array([nic_cap[list(v)].sum() for v in trunk_nics], dtype=float)
    trunk_load = np.array([nic_load[list(v)].sum() for v in trunk_nics], dtype=float)
    trunk_jobs: list[dict[int, float]] = []
    for v in trunk_nics:
        acc: dict[int, float] = defaultdict(float)
        for nic in v:
            for j, r in nic_jobs.get(nic, {}).items():
                acc[j] += r
        trunk_jobs.append(dict(acc))

    up_cap = np.array([bw for _, _, bw, _ in lay.uplinks], dtype=float)
    leaf_members: dict[int, list[int]] = defaultdict(list)
    pod_members: dict[int, list[int]] = defaultdict(list)
    spine_pod: dict[str, int] = {}
    for i, (lo, hi, _, _) in enumerate(lay.uplinks):
        if lay.switch_tier[lo] == "leaf":
            leaf = topo.leaf_by_name[lo]
            leaf_members[leaf].append(i)
            spine_pod[hi] = int(topo.leaf_pod[leaf])
    for i, (lo, _hi, _, _) in enumerate(lay.uplinks):
        if lay.switch_tier[lo] == "spine" and lo in spine_pod:
            pod_members[spine_pod[lo]].append(i)
    leaf_up, leaf_up_jobs = _spread(leaf_load, leaf_jobs, leaf_members, up_cap)
    pod_up, pod_up_jobs = _spread(pod_load, pod_jobs, pod_members, up_cap)
    up_jobs = [a or b for a, b in zip(leaf_up_jobs, pod_up_jobs, strict=True)]
    return LinkLoads(
        nic_cap=nic_cap,
        nic_load=nic_load,
        nic_jobs=dict(nic_jobs),
        trunks=trunks,
        trunk_nics=trunk_nics,
        trunk_cap=trunk_cap,
        trunk_load=trunk_load,
        trunk_jobs=trunk_jobs,
        up_cap=up_cap,
        up_load=leaf_up + pod_up,
        up_jobs=up_jobs,
    )

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
    """Capacities and predicted loads in GB/s, and who causes them ({job index: GB/s}).

    NICs are numbered as in the layout; `nic_job` is the one job loading each NIC (-1: none,
    -2: several, listed in `nic_jobs`). Trunks are `trunks` (group, leaf index) pairs with their
    NIC numbers. Uplinks are `layout.uplinks`; a leaf's jobs are what leaves the leaf over all
    its uplinks (each uplink carries its capacity share), `up_jobs` lists the spine-core ones."""

    nic_cap: np.ndarray
    nic_load: np.ndarray
    nic_job: np.ndarray
    nic_jobs: dict[int, dict[int, float]]
    trunks: tuple[tuple[int, int], ...]
    trunk_nics: tuple[np.ndarray, ...]
    trunk_of_nic: np.ndarray
    trunk_cap: np.ndarray
    trunk_load: np.ndarray
    trunk_jobs: list[dict[int, float]]
    up_cap: np.ndarray
    up_load: np.ndarray
    leaf_jobs: dict[int, dict[int, float]]
    up_jobs: dict[int, dict[int, float]]


def _off_share(rate: np.ndarray, where: np.ndarray, sizes: np.ndarray, n: int, count: int):
    """Per place (leaf or pod) index: the part of `rate` that leaves it, summed: a member's
    traffic goes to the group's members elsewhere in proportion to their number."""
    off = rate * (n - sizes[where]) / n
    return np.bincount(where, weights=off, minlength=count)


def link_loads(lay: ClusterLayout, jobs: Sequence[JobView]) -> LinkLoads:
    """Capacity and predicted load of every link (see the module docstring)."""
    topo = lay.topology
    n_leaves = len(topo.leaf_names)
    n_pods = int(topo.leaf_pod.max()) + 1 if n_leaves else 0
    nic_cap = np.array([nic.bw_GBps for node in topo.nodes for nic in node.nics], dtype=float)
    nic_load = np.zeros(lay.n_nics)
    nic_job = np.full(lay.n_nics, -1, dtype=np.int64)
    own_rate = np.zeros(lay.n_nics)
    nic_jobs: dict[int, dict[int, float]] = {}
    keys = lay.group_of_node[lay.nic_node] * max(1, n_leaves) + lay.nic_leaf
    trunk_keys, trunk_of_nic = np.unique(keys, return_inverse=True)
    trunk_of_nic = trunk_of_nic.reshape(-1).astype(np.int64)
    trunk_jobs: list[dict[int, float]] = [{} for _ in range(trunk_keys.size)]
    leaf_load = np.zeros(n_leaves)
    pod_load = np.zeros(max(n_pods, 1))
    leaf_jobs: dict[int, dict[int, float]] = defaultdict(dict)
    pod_jobs: dict[int, dict[int, float]] = defaultdict(dict)
    for j, job in enumerate(jobs):
        if not job.net_rates:
            continue
        gid = np.fromiter((r[0] for r in job.net_rates), dtype=np.int64, count=len(job.net_rates))
        level = np.array([r[1] for r in job.net_rates])
        rate = np.fromiter((r[2] for r in job.net_rates), dtype=float, count=len(job.net_rates))
        nic = lay.gpu_nic[gid]
        ok = nic >= 0
        if ok.any():
            u, inv = np.unique(nic[ok], return_inverse=True)
            sums = np.bincount(inv.reshape(-1), weights=rate[ok])
            nic_load[u] += sums
            cur = nic_job[u]
            new = cur == -1
            nic_job[u[new]] = j
            own_rate[u[new]] += sums[new]
            same = cur == j
            own_rate[u[same]] += sums[same]
            for k, v in zip(u[~new & ~same].tolist(), sums[~new & ~same].tolist(), strict=True):
                if nic_job[k] >= 0:  # a second job on this NIC: list both
                    nic_jobs[k] = {int(nic_job[k]): float(own_rate[k])}
                    nic_job[k] = -2
                nic_jobs[k][j] = nic_jobs[k].get(j, 0.0) + v
            per_trunk = np.bincount(trunk_of_nic[u], weights=sums, minlength=trunk_keys.size)
            for t in np.flatnonzero(per_trunk).tolist():
                trunk_jobs[t][j] = trunk_jobs[t].get(j, 0.0) + float(per_trunk[t])
        g = np.asarray(job.gids, dtype=np.int64)
        n = g.size
        leaf = topo.gpu_leaf[gid]
        up = np.isin(level, ("spine", "core")) & (leaf >= 0)
        if up.any():
            on_leaf = np.bincount(topo.gpu_leaf[g][topo.gpu_leaf[g] >= 0], minlength=n_leaves)
            off = _off_share(rate[up], leaf[up], on_leaf, n, n_leaves)
            leaf_load += off
            for li in np.flatnonzero(off).tolist():
                leaf_jobs[li][j] = float(off[li])
        pod = topo.gpu_pod[gid]
        core = (level == "core") & (pod >= 0)
        if core.any():
            in_pod = np.bincount(topo.gpu_pod[g][topo.gpu_pod[g] >= 0], minlength=n_pods)
            off = _off_share(rate[core], pod[core], in_pod, n, n_pods)
            pod_load[: off.size] += off
            for p in np.flatnonzero(off).tolist():
                pod_jobs[p][j] = float(off[p])

    trunks = tuple((int(k) // max(1, n_leaves), int(k) % max(1, n_leaves)) for k in trunk_keys.tolist())
    order = np.argsort(trunk_of_nic, kind="stable")
    bounds = np.cumsum(np.bincount(trunk_of_nic, minlength=trunk_keys.size))
    trunk_nics = tuple(np.split(order, bounds[:-1]))
    trunk_cap = np.bincount(trunk_of_nic, weights=nic_cap, minlength=trunk_keys.size)
    trunk_load = np.bincount(trunk_of_nic, weights=nic_load, minlength=trunk_keys.size)

    # Uplinks share their switch's load by capacity (ECMP): leaf-spine by leaf, spine-core by pod.
    up_cap = np.array([bw for _, _, bw, _ in lay.uplinks], dtype=float)
    up_leaf = np.full(up_cap.size, -1, dtype=np.int64)
    up_pod = np.full(up_cap.size, -1, dtype=np.int64)
    spine_pod: dict[str, int] = {}
    for i, (lo, hi, _, _) in enumerate(lay.uplinks):
        if lay.switch_tier[lo] == "leaf":
            up_leaf[i] = topo.leaf_by_name[lo]
            spine_pod[hi] = int(topo.leaf_pod[up_leaf[i]])
    for i, (lo, _hi, _, _) in enumerate(lay.uplinks):
        if lay.switch_tier[lo] == "spine" and lo in spine_pod:
            up_pod[i] = spine_pod[lo]
    up_load = np.zeros(up_cap.size)
    up_jobs: dict[int, dict[int, float]] = {}
    for owner, load, per in ((up_leaf, leaf_load, None), (up_pod, pod_load, pod_jobs)):
        sel = np.flatnonzero(owner >= 0)
        if not sel.size:
            continue
        total = np.bincount(owner[sel], weights=up_cap[sel], minlength=load.size)
        share = up_cap[sel] / np.maximum(total[owner[sel]], 1e-12)
        up_load[sel] += load[owner[sel]] * share
        if per is not None:
            for i, o, sh in zip(sel.tolist(), owner[sel].tolist(), share.tolist(), strict=True):
                if per.get(o):
                    up_jobs[i] = {j: v * sh for j, v in per[o].items()}
    return LinkLoads(
        nic_cap=nic_cap,
        nic_load=nic_load,
        nic_job=nic_job,
        nic_jobs=nic_jobs,
        trunks=trunks,
        trunk_nics=trunk_nics,
        trunk_of_nic=trunk_of_nic,
        trunk_cap=trunk_cap,
        trunk_load=trunk_load,
        trunk_jobs=trunk_jobs,
        up_cap=up_cap,
        up_load=up_load,
        leaf_jobs=dict(leaf_jobs),
        up_jobs=up_jobs,
    )

"""Vectorised path facts for every group of one kind, and for arrays of GPU pairs.

`kind_stats(topo, members)` takes the (groups, size) array of gids of one group kind and returns,
per group, what `Topology.group_path` would (bandwidth GB/s, latency us, level) plus what the
hierarchical allreduce needs (domains, members per domain, rails, intra and inter bottlenecks).
Everything is O(groups * size * log size) numpy work, with no Python loop over groups.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from ..topology import Topology
from .intra import apply_intra, intra_pair_paths

_NIC_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NIC_RATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CORE_TOTALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pod_core_total(topo: Topology) -> np.ndarray:
    """Per pod: the summed rate (GB/s) of its spines' links to core switches (0 without cores)."""
    cached = _CORE_TOTALS.get(topo)
    if cached is None:
        tier = {s.name: s.tier for s in topo.switches}
        spine_pod: dict[str, int] = {}
        for lk in topo.links:
            for leaf, spine in ((lk.a, lk.b), (lk.b, lk.a)):
                if tier.get(leaf) == "leaf" and tier.get(spine) == "spine" and leaf in topo.leaf_by_name:
                    spine_pod[spine] = int(topo.leaf_pod[topo.leaf_by_name[leaf]])
        cached = np.zeros(len(topo.pod_core_bw))
        for lk in topo.links:
            for spine, core in ((lk.a, lk.b), (lk.b, lk.a)):
                if tier.get(core) == "core" and spine in spine_pod:
                    cached[spine_pod[spine]] += lk.bw_GBps
        _CORE_TOTALS[topo] = cached
    return cached


def nic_ids(topo: Topology) -> tuple[np.ndarray, int]:
    """Per-GPU id of its NIC (unique cluster-wide, 0 for standalone GPUs' node slot) and the id count."""
    cached = _NIC_IDS.get(topo)
    if cached is None:
        width = int(topo.gpu_rail.max(initial=-1)) + 2
        ids = topo.gpu_node.astype(np.int64) * width + (topo.gpu_rail.astype(np.int64) + 1)
        cached = (ids, max(int(len(topo.nodes) * width), 1))
        _NIC_IDS[topo] = cached
    return cached


def nic_rates(topo: Topology) -> np.ndarray:
    """Rate (GB/s) of every NIC id of `nic_ids`, 0 for ids no GPU uses."""
    cached = _NIC_RATES.get(topo)
    if cached is None:
        ids, n_nics = nic_ids(topo)
        cached = np.zeros(n_nics)
        cached[ids] = topo.gpu_nic_bw
        _NIC_RATES[topo] = cached
    return cached


@dataclass
class KindStats:
    """Path facts for every group of one kind (one row per group)."""

    members: np.ndarray  # (groups, size) gids
    leaves: np.ndarray  # (groups, size) leaf index of each member, -1 standalone
    level: np.ndarray  # index into LEVELS, as Topology.group_path
    path_bw: np.ndarray  # GB/s, as Topology.group_path
    path_lat: np.ndarray  # us, as Topology.group_path
    spans: np.ndarray  # bool: members in more than one NVLink domain
    multi_leaf: np.ndarray  # bool: spans domains under more than one leaf (traffic on uplinks)
    rail_aligned: np.ndarray  # bool: every domain reaches the same set of leaves
    n_domains: np.ndarray
    k_max: np.ndarray  # most members in one domain
    rails_min: np.ndarray  # fewest distinct NICs among the group's domains
    intra_bw: np.ndarray  # slowest domain holding 2+ members (GB/s), inf if none
    intra_lat: np.ndarray  # us
    inter_bw: np.ndarray  # NIC and uplink bottleneck between domains (GB/s)
    inter_lat: np.ndarray  # us
    nic_bw: np.ndarray  # slowest member NIC (GB/s)
    nic_lat: np.ndarray  # the two slowest member NICs' latencies summed (us)
    nic_share: np.ndarray  # a member NIC's rate over the groups of this kind crossing it, the least (GB/s)


def kind_stats(topo: Topology, members: np.ndarray) -> KindStats:
    """Path facts of every row of `members` (gids, one group per row)."""
    rows, size = members.shape
    dom = topo.gpu_domain[members].astype(np.int64)
    spans = (dom != dom[:, :1]).any(axis=1) if size > 1 else np.zeros(rows, dtype=bool)
    leaves = topo.gpu_leaf[members]
    d0 = dom[:, 0]
    path_bw = topo.domain_bw[d0].astype(float)
    path_lat = (topo.domain_latency[d0] if size > 1 else np.zeros(rows)).astype(float)
    st = KindStats(
        members=members,
        leaves=leaves,
        level=np.zeros(rows, dtype=np.int64),
        path_bw=path_bw,
        path_lat=path_lat,
        spans=spans,
        multi_leaf=np.zeros(rows, dtype=bool),
        rail_aligned=np.ones(rows, dtype=bool),
        n_domains=np.ones(rows, dtype=np.int64),
        k_max=np.full(rows, size, dtype=np.int64),
        rails_min=np.ones(rows, dtype=np.int64),
        intra_bw=path_bw.copy(),
        intra_lat=path_lat.copy(),
        inter_bw=np.full(rows, math.inf),
        inter_lat=np.zeros(rows),
        nic_bw=np.full(rows, math.inf),
        nic_lat=np.zeros(rows),
        nic_share=np.full(rows, math.inf),
    )
    s = np.flatnonzero(spans)
    if s.size:
        _spanning(topo, st, s, dom[s], size)
    if topo.node_intra:
        apply_intra(topo, st)
    return st


def _spanning(topo: Topology, st: KindStats, s: np.ndarray, ds: np.ndarray, size: int) -> None:
    # Rows that span NVLink domains: network paths and the domain / NIC structure per row.
    m = st.members[s]
    lv = st.leaves[s]
    if not topo.leaf_names:
        # No switches at all: every node is standalone, so nothing reaches another domain.
        st.path_bw[s], st.path_lat[s], st.level[s] = 0.0, math.inf, 3
        st.inter_bw[s], st.inter_lat[s], st.nic_bw[s], st.nic_lat[s] = 0.0, math.inf, 0.0, math.inf
        st.rail_aligned[s] = False
        return
    standalone = (lv < 0).any(axis=1)
    lv0 = np.maximum(lv, 0)
    nic_bw = topo.gpu_nic_bw[m].min(axis=1)
    nic_lat = np.partition(topo.gpu_nic_latency[m], size - 2, axis=1)[:, -2:].sum(axis=1)
    ml = (lv0 != lv0[:, :1]).any(axis=1) & ~standalone
    up_bw = np.where(ml, topo.leaf_spine_bw[lv0].min(axis=1), math.inf)
    up_lat = np.where(ml, 2 * topo.leaf_spine_latency[lv0].max(axis=1), 0.0)
    pods = topo.leaf_pod[lv0]
    mp = ml & (pods != pods[:, :1]).any(axis=1)
    core_bw = np.where(mp, topo.pod_core_bw[pods].min(axis=1), math.inf)
    core_lat = np.where(mp, 2 * topo.pod_core_latency[pods].max(axis=1), 0.0)
    ibw = np.where(standalone, 0.0, np.minimum(np.minimum(nic_bw, up_bw), core_bw))
    ilat = np.where(standalone, math.inf, nic_lat + up_lat + core_lat)

    # One sort by (domain, leaf, NIC) gives the domain runs, (domain, leaf) pairs and NIC runs.
    ids, n_nics = nic_ids(topo)
    n_lv = len(topo.leaf_names) + 1
    key = np.sort((ds * n_lv + (lv + 1)) * n_nics + ids[m], axis=1).ravel()
    dl = key // n_nics
    d = dl // n_lv
    row_start = np.zeros(key.size, dtype=bool)
    row_start[::size] = True
    dom_start = row_start.copy()
    dom_start[1:] |= d[1:] != d[:-1]
    dl_start = row_start.copy()
    dl_start[1:] |= dl[1:] != dl[:-1]
    nic_start = row_start.copy()
    nic_start[1:] |= key[1:] != key[:-1]
    row_idx = np.arange(0, key.size, size)
    starts = np.flatnonzero(dom_start)
    run_len = np.diff(np.append(starts, key.size))
    run_rails = np.add.reduceat(nic_start.astype(np.int64), starts)
    run_dom = d[starts]
    nd = np.add.reduceat(dom_start.astype(np.int64), row_idx)
    pairs = np.add.reduceat(dl_start.astype(np.int64), row_idx)
    first_run = np.concatenate(([0], np.cumsum(nd)[:-1]))
    multi = run_len > 1
    run_ibw = np.where(multi, topo.domain_bw[run_dom], math.inf)
    run_ilat = np.where(multi, topo.domain_latency[run_dom], 0.0)
    sorted_leaves = np.sort(lv0, axis=1)
    n_leaves = 1 + (sorted_leaves[:, 1:] != sorted_leaves[:, :-1]).sum(axis=1)

    st.n_domains[s] = nd
    st.k_max[s] = np.maximum.reduceat(run_len, first_run)
    st.rails_min[s] = np.minimum.reduceat(run_rails, first_run)
    intra_bw = np.minimum.reduceat(run_ibw, first_run)
    st.intra_bw[s] = intra_bw
    st.intra_lat[s] = np.maximum.reduceat(run_ilat, first_run)
    st.inter_bw[s] = ibw
    st.inter_lat[s] = ilat
    # Groups on each NIC: every (row, NIC) run of the sorted keys is one group on that NIC.
    nic = key % n_nics
    groups_on = np.bincount(nic[nic_start], minlength=n_nics)
    share = (nic_rates(topo)[nic] / groups_on[nic]).reshape(-1, size).min(axis=1)
    st.nic_share[s] = np.where(standalone, 0.0, share)
    st.nic_bw[s] = np.where(standalone, 0.0, nic_bw)
    st.nic_lat[s] = np.where(standalone, math.inf, nic_lat)
    st.path_bw[s] = np.minimum(ibw, intra_bw)
    st.path_lat[s] = np.maximum(ilat, st.intra_lat[s])
    st.level[s] = np.where(standalone | mp, 3, np.where(ml, 2, 1))
    st.multi_leaf[s] = ml
    # Rail-aligned: each domain has members under every leaf of the group, so each rail's ring
    # between domains can stay under one leaf (rail-optimised clusters).
    st.rail_aligned[s] = (pairs == nd * n_leaves) & ~standalone


def nic_sharing(topo: Topology, sends: np.ndarray, receives: np.ndarray) -> np.ndarray:
    """Per transfer (sender gid -> receiver gid, all at once): the least of the sender's NIC rate
    over the transfers it sends and the receiver's over those it receives (GB/s)."""
    ids, n_nics = nic_ids(topo)
    out_count = np.bincount(ids[sends], minlength=n_nics)
    in_count = np.bincount(ids[receives], minlength=n_nics)
    return np.minimum(
        topo.gpu_nic_bw[sends] / out_count[ids[sends]], topo.gpu_nic_bw[receives] / in_count[ids[receives]]
    )


def pair_paths(topo: Topology, g, h) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised `Topology.path` over arrays of gid pairs: (bw_GBps, latency_us, level index)."""
    g = np.asarray(g, dtype=np.int64)
    h = np.asarray(h, dtype=np.int64)
    dg, dh = topo.gpu_domain[g], topo.gpu_domain[h]
    same = dg == dh
    if not topo.leaf_names:
        bw = np.where(same, topo.domain_bw[dg], 0.0).astype(float)
        lat = np.where(same, topo.domain_latency[dg], math.inf).astype(float)
        if topo.node_intra:
            intra_pair_paths(topo, g, h, bw, lat)
        return bw, lat, np.where(same, 0, 3)
    lg, lh = topo.gpu_leaf[g], topo.gpu_leaf[h]
    standalone = (lg < 0) | (lh < 0)
    lg0, lh0 = np.maximum(lg, 0), np.maximum(lh, 0)
    cross_leaf = lg0 != lh0
    pg, ph = topo.leaf_pod[lg0], topo.leaf_pod[lh0]
    cross_pod = cross_leaf & (pg != ph)
    bw = np.minimum(topo.gpu_nic_bw[g], topo.gpu_nic_bw[h])
    lat = topo.gpu_nic_latency[g] + topo.gpu_nic_latency[h]
    up = np.minimum(topo.leaf_spine_bw[lg0], topo.leaf_spine_bw[lh0])
    bw = np.where(cross_leaf, np.minimum(bw, up), bw)
    lat = lat + np.where(cross_leaf, topo.leaf_spine_latency[lg0] + topo.leaf_spine_latency[lh0], 0.0)
    core = np.minimum(topo.pod_core_bw[pg], topo.pod_core_bw[ph])
    bw = np.where(cross_pod, np.minimum(bw, core), bw)
    lat = lat + np.where(cross_pod, topo.pod_core_latency[pg] + topo.pod_core_latency[ph], 0.0)
    level = np.where(cross_pod | standalone, 3, np.where(cross_leaf, 2, 1))
    bw = np.where(standalone, 0.0, bw)
    lat = np.where(standalone, math.inf, lat)
    bw = np.where(same, topo.domain_bw[dg], bw).astype(float)
    lat = np.where(same, topo.domain_latency[dg], lat).astype(float)
    level = np.where(same, 0, level)
    if topo.node_intra:
        intra_pair_paths(topo, g, h, bw, lat)
    return bw, lat, level

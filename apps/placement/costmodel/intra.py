"""Groups and GPU pairs on nodes with intra-node links (`Node.intra`): the slowest pair of the
group's members on such a node replaces the uniform NVLink domain bandwidth (the bucket effect)."""

from __future__ import annotations

import math

import numpy as np

from ..topology import Topology


def apply_intra(topo: Topology, st) -> None:
    """Correct `KindStats` rows with two or more members on a node with intra links, in place."""
    members = st.members
    rows, size = members.shape
    if size < 2:
        return
    nodes = topo.gpu_node[members]
    on_intra = np.isin(nodes, np.fromiter(topo.node_intra, dtype=np.int64))
    for r in np.flatnonzero(on_intra.sum(axis=1) >= 2):
        m, dom = members[r], topo.gpu_domain[members[r]]
        bw, lat = math.inf, 0.0
        for d in np.unique(dom):
            sub = m[dom == d]
            if sub.size < 2:
                continue
            if int(topo.gpu_node[sub[0]]) in topo.node_intra:
                dbw, dlat = _slowest_pair(topo, sub)
            else:
                dbw, dlat = float(topo.domain_bw[d]), float(topo.domain_latency[d])
            bw, lat = min(bw, dbw), max(lat, dlat)
        st.intra_bw[r], st.intra_lat[r] = bw, lat
        if st.spans[r]:
            st.path_bw[r] = min(st.inter_bw[r], bw)
            st.path_lat[r] = max(st.inter_lat[r], lat)
        else:
            st.path_bw[r], st.path_lat[r] = bw, lat


# (node's intra links, member GPU indices) -> slowest pair: a node's groups repeat across the
# candidates and moves of a placement. The key holds the links object itself, so no other can
# take its identity while the entry lives.
_SLOWEST: dict[tuple[object, bytes], tuple[float, float]] = {}
_SLOWEST_SIZE = 65536


def _slowest_pair(topo: Topology, sub: np.ndarray) -> tuple[float, float]:
    intra = topo.node_intra[int(topo.gpu_node[sub[0]])]
    key = (intra, np.sort(topo.gpu_index[sub]).astype(np.int64).tobytes())
    hit = _SLOWEST.get(key)
    if hit is None:
        if len(_SLOWEST) > _SLOWEST_SIZE:
            _SLOWEST.clear()
        hit = _SLOWEST[key] = topo.intra_pairs(sub)
    return hit


def intra_pair_paths(topo: Topology, g: np.ndarray, h: np.ndarray, bw: np.ndarray, lat: np.ndarray) -> None:
    """Set bandwidth and latency of same-node pairs on nodes with intra links, in place."""
    ng = topo.gpu_node[g]
    for node, intra in topo.node_intra.items():
        sel = (ng == node) & (topo.gpu_node[h] == node) & (g != h)
        if sel.any():
            i, j = topo.gpu_index[g[sel]], topo.gpu_index[h[sel]]
            bw[sel], lat[sel] = intra.bw[i, j], intra.latency[i, j]

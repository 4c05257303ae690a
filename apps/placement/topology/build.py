"""Build a Topology's per-GPU, per-domain, per-leaf and per-pod index arrays from checked entries."""

from __future__ import annotations

import math

import numpy as np

from .model import TIERS, NvlinkDomain, Topology


def _build(name, gpu_models, switches, links, nodes, domains, errs) -> Topology:
    tier_of = {s.name: s.tier for s in switches}
    leaf_names = tuple(s.name for s in switches if s.tier == "leaf")
    leaf_idx = {n: i for i, n in enumerate(leaf_names)}
    # Parallel cables between the same two switches add up.
    cap: dict[tuple[str, str], list[float]] = {}
    for lk in links:
        lo, hi = (lk.a, lk.b) if TIERS.index(tier_of[lk.a]) < TIERS.index(tier_of[lk.b]) else (lk.b, lk.a)
        c = cap.setdefault((lo, hi), [0.0, 0.0, 0])
        c[0] += lk.bw_GBps
        c[1] += lk.latency_us
        c[2] += 1
    up: dict[str, dict[str, tuple[float, float]]] = {}
    for (lo, hi), (bw, lat, k) in cap.items():
        up.setdefault(lo, {})[hi] = (bw, lat / k)

    nl = len(leaf_names)
    leaf_spine_bw = np.full(nl, math.inf)
    leaf_spine_lat = np.zeros(nl)
    leaf_total = np.zeros(nl)
    for i, lf in enumerate(leaf_names):
        ups = up.get(lf, {})
        if ups:
            leaf_spine_bw[i] = min(bw for bw, _ in ups.values())
            leaf_spine_lat[i] = max(lat for _, lat in ups.values())
            leaf_total[i] = sum(bw for bw, _ in ups.values())

    # Pods: leaves joined through shared spines; planes: pods joined through shared cores.
    parent = list(range(nl))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    by_spine: dict[str, list[int]] = {}
    for i, lf in enumerate(leaf_names):
        for sp in up.get(lf, {}):
            by_spine.setdefault(sp, []).append(i)
    for members in by_spine.values():
        for m in members[1:]:
            parent[find(m)] = find(members[0])
    roots = sorted({find(i) for i in range(nl)})
    pod_of_root = {r: k for k, r in enumerate(roots)}
    leaf_pod = np.array([pod_of_root[find(i)] for i in range(nl)], dtype=np.int32)
    n_pods = len(roots)
    pod_core_bw = np.full(n_pods, math.inf)
    pod_core_lat = np.zeros(n_pods)
    pod_cores: list[set[str]] = [set() for _ in range(n_pods)]
    for sp, members in by_spine.items():
        pod = leaf_pod[members[0]]
        for core, (bw, lat) in up.get(sp, {}).items():
            pod_cores[pod].add(core)
            pod_core_bw[pod] = min(pod_core_bw[pod], bw)
            pod_core_lat[pod] = max(pod_core_lat[pod], lat)
    pparent = list(range(n_pods))

    def pfind(x: int) -> int:
        while pparent[x] != x:
            pparent[x] = pparent[pparent[x]]
            x = pparent[x]
        return x

    by_core: dict[str, list[int]] = {}
    for pod, cs in enumerate(pod_cores):
        for c in cs:
            by_core.setdefault(c, []).append(pod)
    for members in by_core.values():
        for m in members[1:]:
            pparent[pfind(m)] = pfind(members[0])
    pod_plane = [pfind(p) for p in range(n_pods)]

    # Every leaf that serves a NIC must reach every other such leaf.
    used_leaves = sorted({leaf_idx[c.leaf] for n in nodes for c in n.nics})
    if used_leaves:
        planes = {pod_plane[leaf_pod[i]] for i in used_leaves}
        if len(planes) > 1:
            first = leaf_names[used_leaves[0]]
            for i in used_leaves:
                if pod_plane[leaf_pod[i]] != pod_plane[leaf_pod[used_leaves[0]]]:
                    errs.add(
                        "links",
                        f"leaf {leaf_names[i]!r} has no path to leaf {first!r} through spines and cores",
                    )
                    break
    errs.raise_if_any()

    dom_names = tuple(domains)
    dom_idx = {d: i for i, d in enumerate(dom_names)}
    n_gpus = sum(n.gpus for n in nodes)
    gpu_node = np.empty(n_gpus, dtype=np.int32)
    gpu_index = np.empty(n_gpus, dtype=np.int32)
    gpu_domain = np.empty(n_gpus, dtype=np.int32)
    gpu_leaf = np.full(n_gpus, -1, dtype=np.int32)
    gpu_rail = np.full(n_gpus, -1, dtype=np.int32)
    gpu_nic_bw = np.zeros(n_gpus)
    gpu_nic_lat = np.zeros(n_gpus)
    node_first = np.empty(len(nodes), dtype=np.int64)
    node_count = np.empty(len(nodes), dtype=np.int32)
    node_domain = np.empty(len(nodes), dtype=np.int32)
    node_leaf = np.full(len(nodes), -1, dtype=np.int32)
    node_peak = np.empty(len(nodes))
    node_rate = np.empty(len(nodes))
    gid = 0
    for ni, n in enumerate(nodes):
        node_first[ni], node_count[ni] = gid, n.gpus
        node_domain[ni] = dom_idx[n.domain]
        node_peak[ni] = gpu_models[n.gpu_model].peak_tflops
        node_rate[ni] = gpu_models[n.gpu_model].rate
        sl = slice(gid, gid + n.gpus)
        gpu_node[sl] = ni
        gpu_index[sl] = np.arange(n.gpus)
        gpu_domain[sl] = dom_idx[n.domain]
        if n.nics:
            node_leaf[ni] = leaf_idx[n.nics[0].leaf]
        for k, c in enumerate(n.nics):
            ids = np.asarray(c.gpus, dtype=np.int64) + gid
            gpu_leaf[ids] = leaf_idx[c.leaf]
            gpu_rail[ids] = k
            gpu_nic_bw[ids] = c.bw_GBps
            gpu_nic_lat[ids] = c.latency_us
        gid += n.gpus
    node_intra = apply_intra(nodes, domains, dom_idx, node_first, gpu_nic_bw, errs)
    domain_bw = np.array([domains[d]["bw"] for d in dom_names], dtype=float)
    domain_lat = np.array([domains[d]["lat"] for d in dom_names], dtype=float)
    for ni, intra in node_intra.items():
        # A node with intra links prices its domain at its fastest pair: bounds stay below any placement.
        d = node_domain[ni]
        off = ~np.eye(intra.bw.shape[0], dtype=bool)
        if off.any():
            domain_bw[d], domain_lat[d] = float(intra.bw[off].max()), float(intra.latency[off].min())
    gpu_pod = np.where(gpu_leaf >= 0, leaf_pod[np.maximum(gpu_leaf, 0)] if nl else -1, -1).astype(np.int32)
    plane_arr = np.asarray(pod_plane, dtype=np.int32)
    gpu_plane = np.where(gpu_pod >= 0, plane_arr[np.maximum(gpu_pod, 0)] if n_pods else -1, -1).astype(
        np.int32
    )
    return Topology(
        name=name,
        gpu_models=dict(gpu_models),
        switches=tuple(switches),
        links=tuple(links),
        nodes=tuple(nodes),
        domains={
            d: NvlinkDomain(d, v["bw"], v["lat"], tuple(v["nodes"]), v.get("nvls"))
            for d, v in domains.items()
        },
        gpu_node=gpu_node,
        gpu_index=gpu_index,
        gpu_domain=gpu_domain,
        gpu_leaf=gpu_leaf,
        gpu_pod=gpu_pod,
        gpu_plane=gpu_plane,
        gpu_nic_bw=gpu_nic_bw,
        gpu_nic_latency=gpu_nic_lat,
        gpu_rail=gpu_rail,
        domain_names=dom_names,
        domain_bw=domain_bw,
        domain_latency=domain_lat,
        leaf_names=leaf_names,
        leaf_spine_bw=leaf_spine_bw,
        leaf_spine_latency=leaf_spine_lat,
        leaf_uplink_total_bw=leaf_total,
        leaf_pod=leaf_pod,
        pod_core_bw=pod_core_bw,
        pod_core_latency=pod_core_lat,
        node_first_gid=node_first,
        node_gpu_count=node_count,
        node_domain=node_domain,
        node_leaf=node_leaf,
        node_peak_tflops=node_peak,
        node_rate=node_rate,
        node_intra=node_intra,
    )


def apply_intra(nodes, domains, dom_idx, node_first, gpu_nic_bw, errs) -> dict:
    """Nodes with intra links by index; checks each has its domain alone and caps each GPU's NIC
    bandwidth by the PCIe class between them."""
    out = {}
    for ni, n in enumerate(nodes):
        if n.intra is None:
            continue
        if domains[n.domain]["nodes"] != [n.name]:
            errs.add(
                f"nodes[{ni}].intra",
                f"node {n.name!r} shares NVLink domain {n.domain!r}; intra links need a domain of its own",
            )
            continue
        for c in n.nics:
            for g in c.gpus:
                gid = int(node_first[ni]) + g
                gpu_nic_bw[gid] = min(gpu_nic_bw[gid], n.intra.nic_bw(c.name, g))
        out[ni] = n.intra
    errs.raise_if_any()
    return out

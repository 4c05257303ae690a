"""The client half of the cluster figure: compact data that `static/dashboard/cluster.js` turns
into hover text, highlights and overlay colours, so that 16k GPUs cost no 16k hover strings."""

from __future__ import annotations

import numpy as np

from apps.dashboard import layout as geo
from apps.dashboard.jobview import JobView, crossed_links
from apps.dashboard.links import LinkLoads
from apps.dashboard.network_traces import LOAD_BUCKETS, Y_BUNDLE, trunk_x
from apps.dashboard.traces import rounded

OUTLINE_PAD_X = 0.45  # a job outline's margin around its GPU squares, in x slots and y units
OUTLINE_PAD_Y = 0.13


def _group_table(job: JobView) -> tuple[dict, dict]:
    """A job's groups as compact rows [index, size, level, bottleneck GB/s, ms per step] per kind,
    and for each kind the row of every rank (-1: in no group of that kind)."""
    table: dict[str, list] = {}
    of_rank: dict[str, list[int]] = {}
    for kind, views in job.groups.items():
        rows = []
        pos = np.full(len(job.gids), -1, dtype=np.int64)
        for k, g in enumerate(views):
            bw = g.bottleneck_GBps if np.isfinite(g.bottleneck_GBps) else 0.0
            t = None if g.time_ms is None or not np.isfinite(g.time_ms) else round(g.time_ms, 4)
            rows.append([g.index, len(g.ranks), g.level, round(bw, 3), t])
            pos[list(g.ranks)] = k
        table[kind] = rows
        of_rank[kind] = pos.tolist()
    return table, of_rank


def _rows(per_job: dict[int, float]) -> list:
    """[[job, GB/s], ...] largest first, without idle entries."""
    rows = sorted(((j, v) for j, v in per_job.items() if v > 0), key=lambda jv: -jv[1])
    return [[int(j), round(float(v), 3)] for j, v in rows]


def link_data(lay, loads: LinkLoads, gpu_job: np.ndarray) -> dict:
    """The links for the client's drawing, hover text and load overlay, sent once: uplinks then
    trunks in one number space (as the hover trace's customdata), each with its ends (a trunk's
    lower end is its leaf group, as -1 - group), segment, capacity and predicted load; jobs per
    link as [[job, GB/s]]: per leaf for leaf-spine uplinks (each uplink carries its capacity
    share), per link for the rest. Per NIC: capacity, load, its trunk, and its jobs where its
    GPUs' own job does not say (several jobs, or traffic of a job that is not on its GPUs)."""
    topo = lay.topology
    names = [s.name for s in topo.switches]
    pos = {n: i for i, n in enumerate(names)}
    n_up = len(lay.uplinks)
    tx = trunk_x(lay, loads)
    seg = [lay.uplink_segment(i) for i in range(n_up)]
    seg_out = [[round(s.x0, 3), round(s.y0, 3), round(s.x1, 3), round(s.y1, 3)] for s in seg]
    seg_out += [
        [round(float(tx[t]), 3), Y_BUNDLE, round(lay.switch_x[topo.leaf_names[leaf]], 3), geo.Y_LEAF]
        for t, (_, leaf) in enumerate(loads.trunks)
    ]
    jobs: dict[str, list] = {str(i): _rows(d) for i, d in loads.up_jobs.items() if d}
    for t, per_job in enumerate(loads.trunk_jobs):
        if per_job:
            jobs[str(n_up + t)] = _rows(per_job)
    leaf_jobs = {str(pos[topo.leaf_names[li]]): _rows(d) for li, d in loads.leaf_jobs.items() if d}
    # The client takes a NIC's job from its first busy GPU: list the NICs where that is wrong.
    busy = np.flatnonzero((lay.gpu_nic >= 0) & (gpu_job >= 0))
    first_job = np.full(lay.n_nics, -1, dtype=np.int64)
    first_job[lay.gpu_nic[busy][::-1]] = gpu_job[busy][::-1]
    nic_jobs = {str(k): _rows(d) for k, d in loads.nic_jobs.items()}
    odd = np.flatnonzero((loads.nic_job >= 0) & (loads.nic_job != first_job) & (loads.nic_load > 0))
    for k in odd.tolist():
        nic_jobs[str(k)] = [[int(loads.nic_job[k]), round(float(loads.nic_load[k]), 3)]]
    nic_cap = loads.nic_cap
    uniform = nic_cap.size > 0 and bool((nic_cap == nic_cap[0]).all())
    loaded = np.flatnonzero(loads.nic_load > 0)
    return {
        "switches": names,
        "tier": [s.tier for s in topo.switches],
        "a": [pos[lo] for lo, _, _, _ in lay.uplinks] + [-1 - g for g, _ in loads.trunks],
        "b": [pos[hi] for _, hi, _, _ in lay.uplinks]
        + [pos[topo.leaf_names[leaf]] for _, leaf in loads.trunks],
        "n_uplinks": n_up,
        "trunk_cables": [int(n.size) for n in loads.trunk_nics],
        "trunk_rail": [int(lay.nic_rail[n[0]]) for n in loads.trunk_nics],
        "cap": rounded(np.concatenate([loads.up_cap, loads.trunk_cap])),
        "load": rounded(np.concatenate([loads.up_load, loads.trunk_load])),
        "jobs": jobs,
        "leaf_jobs": leaf_jobs,
        "seg": seg_out,
        "nic_cap": float(nic_cap[0]) if uniform else rounded(nic_cap),
        "nic_load": dict(zip(map(str, loaded.tolist()), rounded(loads.nic_load[loaded]), strict=True)),
        "nic_jobs": nic_jobs,
        "nic_trunk": (loads.trunk_of_nic + n_up).tolist(),
    }


def client_data(
    lay, jobs, looks, gpu_job, gpu_rank, metrics, loads, bars, *, overlays, aggregate_above
) -> dict:
    """Everything the client script needs besides the traces: per-GPU arrays (position, job,
    rank, node, NIC) for hover text and highlight, per-job GPUs, style, crossed cables and group
    table, the links, the bars' segments, the overlays' values, and the zoom level at which to
    aggregate."""
    topo = lay.topology
    jobs_out = []
    up_index = {(lo, hi): i for i, (lo, hi, _, _) in enumerate(lay.uplinks)}
    leaf_ups: dict[int, list[int]] = {}
    spine_ups: dict[str, list[int]] = {}
    for (lo, _hi), i in up_index.items():
        if lay.switch_tier[lo] == "leaf":
            leaf_ups.setdefault(topo.leaf_by_name[lo], []).append(i)
        else:
            spine_ups.setdefault(lo, []).append(i)
    spine_pod: dict[str, int] = {}
    for (lo, hi), _ in up_index.items():
        if lay.switch_tier[lo] == "leaf":
            spine_pod[hi] = int(topo.leaf_pod[topo.leaf_by_name[lo]])
    for j, job in enumerate(jobs):
        nic_gids, leaves, pods = crossed_links(topo, job.gids, job.groups)
        nics = sorted({int(lay.gpu_nic[g]) for g in nic_gids if lay.gpu_nic[g] >= 0})
        groups, rank_group = _group_table(job)
        ups = sorted({i for leaf in leaves for i in leaf_ups.get(leaf, ())})
        ups += sorted(i for sp, ids in spine_ups.items() if spine_pod.get(sp) in pods for i in ids)
        color, symbol, hatch = looks[j]
        jobs_out.append(
            {
                "id": job.id,
                "label": job.label,
                "color": color,
                "symbol": symbol,
                "hatch": hatch,
                "details": job.details,
                "url": job.url,
                "gids": [int(g) for g in job.gids],
                "nics": nics,
                "uplinks": ups,
                "groups": groups,
                "rank_group": rank_group,
            }
        )
    # NIC names repeat on every node (mlx5_0..): send each once and an index per NIC.
    nic_names = sorted(set(lay.nic_names))
    name_pos = {n: i for i, n in enumerate(nic_names)}
    nic_name = [name_pos[n] for n in lay.nic_names]
    n_groups = len(lay.group_names)
    return {
        "cluster": topo.name,
        "n_gpus": topo.n_gpus,
        "n_nodes": len(topo.nodes),
        "aggregate_above_nodes": aggregate_above,
        "gpu_x": rounded(lay.gpu_x),
        "gpu_y": rounded(lay.gpu_y),
        "gpu_job": gpu_job.tolist(),
        "gpu_rank": gpu_rank.tolist(),
        "gpu_node": topo.gpu_node.tolist(),
        "gpu_index": topo.gpu_index.tolist(),
        "gpu_nic": lay.gpu_nic.tolist(),
        "node_names": [n.name for n in topo.nodes],
        "nic_names": nic_names,
        "nic_name": nic_name,
        "nic_leaf": lay.nic_leaf.tolist(),
        "nic_node": lay.nic_node.tolist(),
        "leaf_names": list(topo.leaf_names),
        "node_x": rounded(lay.node_x),
        "node_x0": rounded(lay.node_x0),
        "node_x1": rounded(lay.node_x1),
        "node_group": lay.group_of_node.tolist(),
        "group_names": list(lay.group_names),
        "group_x0": rounded([lay.node_x0[lay.group_of_node == g].min() for g in range(n_groups)]),
        "group_x1": rounded([lay.node_x1[lay.group_of_node == g].max() for g in range(n_groups)]),
        "node_y0": rounded(lay.node_y0),
        "node_leaf": topo.node_leaf.tolist(),
        "node_gpus": topo.node_gpu_count.tolist(),
        "nic_x": rounded(lay.nic_x),
        "y_nic": geo.Y_NIC,
        "y_node": geo.Y_NODE,
        "y_bundle": Y_BUNDLE,
        "y_leaf": geo.Y_LEAF,
        "jobs": jobs_out,
        "overlays": [{"key": k, "label": label} for k, label in overlays],
        "metrics": metrics,
        "links": link_data(lay, loads, gpu_job),
        "load_buckets": [None if u == float("inf") else u for u, _, _ in LOAD_BUCKETS],
        "bars": bars,
        "outline_pad": [OUTLINE_PAD_X, OUTLINE_PAD_Y],
    }

"""The client half of the cluster figure: compact data that `static/dashboard/cluster.js` turns
into hover text, highlights and overlay colours, so that 16k GPUs cost no 16k hover strings."""

from __future__ import annotations

import numpy as np

from apps.dashboard import layout as geo
from apps.dashboard.jobview import JobView, crossed_links
from apps.dashboard.traces import rounded


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


def client_data(
    lay, jobs, job_colors, gpu_job, gpu_rank, metrics, agg_metrics, loads, *, overlays, aggregate_above
) -> dict:
    """Everything the client script needs besides the traces: per-GPU arrays (position, job,
    rank, node, NIC) for hover text and highlight, per-job GPUs, crossed cables and group table,
    cable coordinates, the overlays' values, and the zoom level at which to aggregate."""
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
        jobs_out.append(
            {
                "id": job.id,
                "label": job.label,
                "color": job_colors[j],
                "details": job.details,
                "url": job.url,
                "gids": [int(g) for g in job.gids],
                "nics": nics,
                "uplinks": ups,
                "groups": groups,
                "rank_group": rank_group,
            }
        )
    seg = [lay.uplink_segment(i) for i in range(len(lay.uplinks))]
    leaf_x = {name: lay.switch_x[name] for name in topo.leaf_names}
    # NIC names repeat on every node (mlx5_0..): send each once and an index per NIC.
    nic_names = sorted(set(lay.nic_names))
    name_pos = {n: i for i, n in enumerate(nic_names)}
    nic_name = [name_pos[n] for n in lay.nic_names]
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
        "leaf_names": list(topo.leaf_names),
        "node_x": rounded(lay.node_x),
        "node_group": lay.group_of_node.tolist(),
        "group_x0": rounded([lay.node_x0[lay.group_of_node == g].min() for g in range(len(lay.group_names))]),
        "group_x1": rounded([lay.node_x1[lay.group_of_node == g].max() for g in range(len(lay.group_names))]),
        "nic_x": rounded(lay.nic_x),
        "nic_leaf_x": rounded([leaf_x[topo.leaf_names[int(i)]] for i in lay.nic_leaf]),
        "y_nic": geo.Y_NIC,
        "y_leaf": geo.Y_LEAF,
        "uplinks": [[round(s.x0, 3), round(s.y0, 3), round(s.x1, 3), round(s.y1, 3)] for s in seg],
        "jobs": jobs_out,
        "overlays": [{"key": k, "label": label} for k, label in overlays],
        "metrics": metrics,
        "aggregate": agg_metrics,
        "leaf_flows": {name: round(float(v), 3) for name, v in zip(topo.leaf_names, loads, strict=True) if v},
    }

"""The network layers of the cluster graph: switch-to-switch cables bucketed by link load,
NIC-to-leaf cables (one trace per rail in rail-optimized clusters), NVLink domain boxes,
switches, NICs and node hover targets."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from apps.dashboard import layout as geo
from apps.dashboard.jobview import JobView
from apps.dashboard.traces import (
    DOMAIN_COLOR,
    LINK_COLOR,
    RAIL_PALETTE,
    SWITCH_COLORS,
    WIRE_COLOR,
    boxes,
    lines,
    markers,
    segments,
)

# Heavy flows on a leaf's uplinks: (bucket upper bound, line width in px, colour).
LOAD_BUCKETS = (
    (0.0, 1.0, "#cfd8dc"),
    (1.0, 2.0, "#fdd835"),
    (2.0, 3.0, "#fb8c00"),
    (4.0, 4.5, "#e53935"),
    (8.0, 6.0, "#8e0038"),
    (float("inf"), 8.0, "#4a0072"),
)


def leaf_loads(lay: geo.ClusterLayout, jobs: Sequence[JobView]) -> np.ndarray:
    """Heavy flows on each leaf's uplinks, summed over the running jobs' predicted flows."""
    topo = lay.topology
    load = np.zeros(len(topo.leaf_names))
    for job in jobs:
        for leaf, flows in job.flows.items():
            i = topo.leaf_by_name.get(leaf)
            if i is not None:
                load[i] += float(flows)
    return load


def uplink_traces(lay: geo.ClusterLayout, loads: np.ndarray) -> list[dict]:
    """Spine-core cables, and leaf-spine cables in one trace per load bucket (grey until the
    load overlay gives each bucket its colour and width, kept in `meta`)."""
    topo = lay.topology
    up_lo = [lo for lo, _, _, _ in lay.uplinks]
    leaf_up = [i for i, lo in enumerate(up_lo) if lay.switch_tier[lo] == "leaf"]
    core_up = [i for i, lo in enumerate(up_lo) if lay.switch_tier[lo] != "leaf"]
    seg = [lay.uplink_segment(i) for i in range(len(lay.uplinks))]

    def seg_xy(idx):
        return segments(
            [seg[i].x0 for i in idx],
            [seg[i].y0 for i in idx],
            [seg[i].x1 for i in idx],
            [seg[i].y1 for i in idx],
        )

    out = []
    if core_up:
        out.append(lines("spine-core links", *seg_xy(core_up), LINK_COLOR, 1, "uplink"))
    leaf_of_up = np.array([topo.leaf_by_name[up_lo[i]] for i in leaf_up], dtype=np.int64)
    up_flows = loads[leaf_of_up] if leaf_up else np.zeros(0)
    lower = -1.0
    for upper, width, color in LOAD_BUCKETS:
        sel = [leaf_up[k] for k in np.flatnonzero((up_flows > lower) & (up_flows <= upper))]
        label = "no heavy flows" if upper == 0 else f"{lower:g}-{upper:g} flows"
        if upper == float("inf"):
            label = f"over {lower:g} flows"
        lower = upper
        if sel:
            t = lines(f"link load: {label}", *seg_xy(sel), LINK_COLOR, 1, "load")
            t["meta"].update(load_color=color, load_width=width)
            out.append(t)
    return out


def cable_traces(lay: geo.ClusterLayout) -> list[dict]:
    """NIC-to-leaf cables (per rail when NICs of one node go to different leaves) and, for the
    zoomed-out view, one cable per (leaf group, leaf) pair."""
    topo = lay.topology
    if not lay.n_nics:
        return []
    leaf_x = np.array([lay.switch_x[name] for name in topo.leaf_names])
    wx1 = leaf_x[lay.nic_leaf]
    out = []
    rails = sorted(set(lay.nic_rail.tolist())) if lay.rail_optimized else [None]
    for rail in rails:
        sel = np.flatnonzero(lay.nic_rail == rail) if rail is not None else np.arange(lay.n_nics)
        xs, ys = segments(
            lay.nic_x[sel], np.full(sel.size, geo.Y_NIC), wx1[sel], np.full(sel.size, geo.Y_LEAF)
        )
        name = f"rail {rail}" if rail is not None else "NIC cables"
        color = RAIL_PALETTE[rail % len(RAIL_PALETTE)] if rail is not None else WIRE_COLOR
        out.append(lines(name, xs, ys, color, 1, "wire", legend=rail is not None))
    gx0, gx1 = [], []
    for g, leaves in enumerate(lay.group_leaves):
        for leaf in leaves:
            gx0.append(lay.group_x[g])
            gx1.append(leaf_x[leaf])
    xs, ys = segments(gx0, [geo.Y_AGG + 0.3] * len(gx0), gx1, [geo.Y_LEAF] * len(gx1))
    out.append(lines("cables (per leaf group)", xs, ys, WIRE_COLOR, 1, "agg-wire"))
    return out


def domain_traces(lay: geo.ClusterLayout) -> list[dict]:
    """NVLink domain boxes, and node boxes inside them when one domain spans several nodes."""
    topo = lay.topology
    dom_nodes: dict[int, list[int]] = {}
    for i in range(len(topo.nodes)):
        dom_nodes.setdefault(int(topo.node_domain[i]), []).append(i)
    multi = any(len(v) > 1 for v in dom_nodes.values())
    out = []
    if multi:
        xs, ys = boxes(lay.node_x0, lay.node_x1, lay.node_y0, np.full(len(topo.nodes), geo.Y_NODE - 0.1))
        out.append(lines("nodes", xs, ys, "#90a4ae", 1, "domain"))
    d_ids = list(dom_nodes)
    pad = 0.25 if multi else 0.0
    xs, ys = boxes(
        [lay.node_x0[dom_nodes[d]].min() - pad for d in d_ids],
        [lay.node_x1[dom_nodes[d]].max() + pad for d in d_ids],
        [lay.node_y0[dom_nodes[d]].min() - pad for d in d_ids],
        [geo.Y_NODE - 0.1 + pad] * len(d_ids),
    )
    out.append(lines("NVLink domain", xs, ys, DOMAIN_COLOR, 1.5, "domain", legend=True))
    return out + intra_traces(lay)


# Intra-node pairs drawn as lines: NVLink pairs, and PCIe pairs under one switch (PIX, PXB); the
# rest (through a CPU or across sockets) are the node box itself.
INTRA_DRAWN = {"NV": ("NVLink pairs", "#2e7d32"), "PCIe": ("PCIe switch pairs", "#78909c")}


def intra_traces(lay: geo.ClusterLayout) -> list[dict]:
    """Inside nodes with intra links (PCIe-only, partial NVLink): a line per NVLink pair and per
    pair under one PCIe switch, and a hover at each line's middle with the class and bandwidth."""
    topo = lay.topology
    if not topo.node_intra:
        return []
    segs: dict[str, tuple[list, list]] = {k: ([], []) for k in INTRA_DRAWN}
    mid_x, mid_y, text = [], [], []
    for ni, intra in topo.node_intra.items():
        first = int(topo.node_first_gid[ni])
        n = intra.bw.shape[0]
        for i in range(n):
            for j in range(i + 1, n):
                cls = intra.links[i][j]
                kind = "NV" if cls.startswith("NV") else "PCIe" if cls in ("PIX", "PXB") else None
                if kind is None:
                    continue
                a, b = first + i, first + j
                xs, ys = segs[kind]
                xs += [float(lay.gpu_x[a]), float(lay.gpu_x[b]), None]
                ys += [float(lay.gpu_y[a]), float(lay.gpu_y[b]), None]
                mid_x.append((lay.gpu_x[a] + lay.gpu_x[b]) / 2)
                mid_y.append((lay.gpu_y[a] + lay.gpu_y[b]) / 2)
                text.append(
                    f"{topo.nodes[ni].name} GPU {i} - GPU {j}: {cls}, {intra.bw[i, j]:.4g} GB/s, "
                    f"{intra.latency[i, j]:.3g} us"
                )
    out = []
    for kind, (name, color) in INTRA_DRAWN.items():
        xs, ys = segs[kind]
        if xs:
            trace = lines(name, xs, ys, color, 1.5 if kind == "NV" else 1, "domain", legend=True)
            if kind == "PCIe":
                trace["line"]["dash"] = "dot"
            out.append(trace)
    if text:
        out.append(
            markers("intra-node links", mid_x, mid_y, text, "domain", marker={"size": 4, "color": "#546e7a"})
        )
    return out


def switch_traces(lay: geo.ClusterLayout, loads: np.ndarray) -> list[dict]:
    """One marker trace per tier; a leaf's hover gives its uplink capacity and predicted load."""
    topo = lay.topology
    ups_of: dict[str, list[float]] = {}
    for lo, _, bw, _ in lay.uplinks:
        ups_of.setdefault(lo, []).append(bw)
    out = []
    for tier, symbol, size in (("core", "diamond", 14), ("spine", "square", 13), ("leaf", "square", 11)):
        names = [s.name for s in topo.switches if s.tier == tier]
        if not names:
            continue
        text = []
        for s in names:
            ups = ups_of.get(s, [])
            line = f"<b>{s}</b> ({tier})"
            if ups:
                line += f"<br>{len(ups)} uplinks, {sum(ups):.4g} GB/s in all"
            if tier == "leaf":
                flows = float(loads[topo.leaf_by_name[s]])
                line += f"<br>uplink load: {flows:.3g} heavy flows (predicted)"
                if flows > 0 and ups:
                    line += f", {sum(ups) / flows:.4g} GB/s each"
            text.append(line)
        out.append(
            markers(
                f"{tier} switches",
                [lay.switch_x[s] for s in names],
                [lay.switch_y[s] for s in names],
                text,
                "switch",
                marker={"color": SWITCH_COLORS[tier], "size": size, "symbol": symbol},
                customdata=names,
            )
        )
    return out


def nic_and_node_traces(lay: geo.ClusterLayout, gpu_job: np.ndarray) -> list[dict]:
    """NIC markers (no hover: a GPU's hover names its NIC and leaf) and invisible node markers
    whose hover gives the node's leaf, GPUs and free count."""
    topo = lay.topology
    out = []
    if lay.n_nics:
        marker = {"color": "#546e7a", "size": 5, "symbol": "diamond"}
        out.append(markers("NICs", lay.nic_x, np.full(lay.n_nics, geo.Y_NIC), None, "nic", marker=marker))
    free_per_node = np.bincount(topo.gpu_node[gpu_job < 0], minlength=len(topo.nodes))
    text = []
    for i, node in enumerate(topo.nodes):
        leaf = topo.leaf_names[int(topo.node_leaf[i])] if topo.node_leaf[i] >= 0 else "standalone"
        text.append(
            f"<b>{node.name}</b> · {leaf}<br>{node.gpus} × {node.gpu_model}, {int(free_per_node[i])} free"
            f"<br>NVLink domain {node.domain}"
        )
    marker = {"color": "#78909c", "size": 8, "symbol": "line-ew"}
    out.append(
        markers(
            "nodes", lay.node_x, np.full(len(topo.nodes), geo.Y_NODE), text, "node", marker=marker, opacity=0
        )
    )
    return out

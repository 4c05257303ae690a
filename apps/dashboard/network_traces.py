"""The network layers of the cluster graph: switch-to-switch cables bucketed by link load,
NIC-to-leaf cables (one trace per rail in rail-optimized clusters), NVLink domain boxes,
switches, NICs and node hover targets."""

from __future__ import annotations

import numpy as np

from apps.dashboard import layout as geo
from apps.dashboard.links import LinkLoads
from apps.dashboard.traces import (
    DOMAIN_COLOR,
    LINK_COLOR,
    RAIL_PALETTE,
    SWITCH_COLORS,
    WIRE_COLOR,
    boxes,
    lines,
    markers,
)

# Link load as a share of capacity: (bucket upper bound, line width in px, colour), light to dark
# so the order reads without hue.
LOAD_BUCKETS = (
    (0.0, 1.0, "#cfd8dc"),
    (0.1, 1.5, "#fee391"),
    (0.4, 2.5, "#fec44f"),
    (0.7, 4.0, "#fe9929"),
    (0.9, 5.5, "#d95f0e"),
    (float("inf"), 7.0, "#662506"),
)
Y_BUNDLE = 2.25  # where a leaf group's NIC cables meet in one trunk per leaf


def load_bucket_label(k: int) -> str:
    """Legend label of load bucket `k`."""
    upper = LOAD_BUCKETS[k][0]
    lower = LOAD_BUCKETS[k - 1][0] if k else None
    if lower is None:
        return "link load: idle"
    if upper == float("inf"):
        return f"link load: over {lower:.0%}"
    return f"link load: {lower:.0%}-{upper:.0%}"


def trunk_x(lay: geo.ClusterLayout, loads: LinkLoads) -> np.ndarray:
    """x of each trunk's lower end: halfway between the mean x of its NICs and its leaf, so that
    the rails of one leaf group fan out to separate bundles rather than one knot."""
    leaf_x = [lay.switch_x[lay.topology.leaf_names[leaf]] for _, leaf in loads.trunks]
    return np.array(
        [
            (float(lay.nic_x[list(nics)].mean()) + x) / 2
            for nics, x in zip(loads.trunk_nics, leaf_x, strict=True)
        ]
    )


def uplink_traces(lay: geo.ClusterLayout, loads: LinkLoads) -> list[dict]:
    """Switch-to-switch cables in grey, and one trace per load bucket for the load overlay. The
    client fills their coordinates from the link data (`meta.fill`), sent once."""
    out = []
    if lay.uplinks:
        t = lines("switch links", [], [], LINK_COLOR, 1, "uplink")
        t["meta"]["fill"] = "uplinks"
        out.append(t)
    for k, (upper, width, color) in enumerate(LOAD_BUCKETS):
        t = lines(load_bucket_label(k), [], [], color, width, "load")
        t["meta"].update(load_color=color, load_width=width, upper=None if upper == float("inf") else upper)
        out.append(t)
    return out


def cable_traces(lay: geo.ClusterLayout, loads: LinkLoads) -> list[dict]:
    """NIC-to-leaf cables, bundled: each NIC's short cable to its trunk (shown zoomed in) and one
    trunk per (leaf group, leaf), coloured per rail when a node's NICs go to different leaves.
    The client draws them from the link data (`meta.fill`, `meta.rail`)."""
    if not lay.n_nics:
        return []
    out = []
    rails = sorted(set(lay.nic_rail.tolist())) if lay.rail_optimized else [None]
    for rail in rails:
        name = f"rail {rail}" if rail is not None else "NIC cables"
        color = RAIL_PALETTE[rail % len(RAIL_PALETTE)] if rail is not None else WIRE_COLOR
        wire = lines(name, [], [], color, 1, "wire")
        wire["meta"].update(fill="wires", rail=rail)
        trunk = lines(name, [], [], color, 2, "trunk", legend=rail is not None)
        trunk["meta"].update(fill="trunks", rail=rail)
        out += [wire, trunk]
    return out


def link_hover_trace() -> dict:
    """Hover targets at the middle of every uplink and trunk (customdata: link number, uplinks
    first); the client places them and writes their text (capacity, load, jobs)."""
    marker = {"color": "#455a64", "size": 6, "symbol": "circle"}
    t = markers("links", [], [], [], "link", marker=marker, opacity=0.35)
    t["meta"]["fill"] = "link-mid"
    return t


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
    pad = 0.25 if multi else 0.0
    # A node whose intra links have no NVLink pair is a box of its own, not an "NVLink domain".
    pcie = {d for d, nodes in dom_nodes.items() if all(_pcie_only(topo, i) for i in nodes)}
    for name, d_ids, color in (
        ("NVLink domain", [d for d in dom_nodes if d not in pcie], DOMAIN_COLOR),
        ("node without NVLink (PCIe only)", [d for d in dom_nodes if d in pcie], PCIE_NODE_COLOR),
    ):
        if not d_ids:
            continue
        xs, ys = boxes(
            [lay.node_x0[dom_nodes[d]].min() - pad for d in d_ids],
            [lay.node_x1[dom_nodes[d]].max() + pad for d in d_ids],
            [lay.node_y0[dom_nodes[d]].min() - pad for d in d_ids],
            [geo.Y_NODE - 0.1 + pad] * len(d_ids),
        )
        t = lines(name, xs, ys, color, 1.5, "domain", legend=True)
        if color == PCIE_NODE_COLOR:
            t["line"]["dash"] = "dash"
        out.append(t)
    return out + intra_traces(lay)


PCIE_NODE_COLOR = "#8d6e63"


def _pcie_only(topo, node: int) -> bool:
    """True when the node's intra links are known and none of its GPU pairs is NVLink."""
    intra = topo.node_intra.get(node) if topo.node_intra else None
    if intra is None:
        return False
    n = intra.bw.shape[0]
    return n > 1 and not any(intra.links[i][j].startswith("NV") for i in range(n) for j in range(i + 1, n))


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


def switch_traces(lay: geo.ClusterLayout, loads: LinkLoads) -> list[dict]:
    """One marker trace per tier; a switch's hover gives its uplink capacity and predicted load."""
    topo = lay.topology
    ups_of: dict[str, list[float]] = {}
    load_of: dict[str, float] = {}
    for i, (lo, _, bw, _) in enumerate(lay.uplinks):
        ups_of.setdefault(lo, []).append(bw)
        load_of[lo] = load_of.get(lo, 0.0) + float(loads.up_load[i])
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
                load = load_of.get(s, 0.0)
                line += f"<br>uplink load {load:.4g} GB/s, {load / sum(ups):.0%} (predicted)"
            text.append(line)
        t = markers(
            f"{tier} switches",
            [lay.switch_x[s] for s in names],
            [lay.switch_y[s] for s in names],
            text,
            "switch",
            marker={"color": SWITCH_COLORS[tier], "size": size, "symbol": symbol},
            customdata=names,
        )
        if len(names) <= SWITCH_LABELS_UP_TO:
            # Named on the drawing (hover keeps the details) while the names can fit.
            t["hovertext"] = t.pop("text")
            t["hovertemplate"] = "%{hovertext}<extra></extra>"
            t["text"] = names
            t["mode"] = "markers+text"
            t["textposition"] = "top center"
            t["textfont"] = {"size": 10}
        out.append(t)
    return out


SWITCH_LABELS_UP_TO = 48  # switches of one tier named on the graph; more would overlap


def nic_and_node_traces(lay: geo.ClusterLayout) -> list[dict]:
    """NIC markers, invisible node markers (hover: the node's leaf, GPUs and free count; click:
    its page) and node name labels under the nodes (shown once they fit). The client places
    them and writes their text from the client data (`meta.fill`)."""
    out = []
    if lay.n_nics:
        marker = {"color": "#546e7a", "size": 5, "symbol": "diamond"}
        t = markers("NICs", [], [], [], "nic", marker=marker)
        t["meta"]["fill"] = "nics"
        out.append(t)
    marker = {"color": "#78909c", "size": 8, "symbol": "line-ew"}
    node = markers("nodes", [], [], [], "node", marker=marker, opacity=0)
    node["meta"]["fill"] = "nodes"
    label = markers(
        "node names",
        [],
        [],
        None,
        "node-label",
        marker={"size": 1},
        mode="text",
        textfont={"size": 10},
        textposition="middle center",
    )
    label["meta"]["fill"] = "node-labels"
    return out + [node, label]

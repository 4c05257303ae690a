"""The path view: the route between two GPUs (or two nodes) hop by hop, with each hop's
bandwidth and latency from the placement core's path model, its bottleneck, and the node-pair
matrix of one leaf. Pure: positions come from the drawing layout, no Django."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from apps.dashboard import layout as geo
from apps.dashboard.layout import ClusterLayout
from apps.placement.topology import Topology

MAX_ENDPOINT_CHARS = 200
MATRIX_MAX_NODES = 64
_ENDPOINT = re.compile(r"^(?P<node>[^:\s]+)(?::(?P<gpu>\d{1,4}))?$")


class EndpointError(ValueError):
    """An endpoint the cluster does not have; `field` names the query parameter."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Endpoint:
    """A GPU (`gpu` set) or a whole node."""

    node: int
    gpu: int | None


def parse_endpoint(topo: Topology, field: str, text: str) -> Endpoint:
    """`node` or `node:gpu` (GPU index on the node) -> Endpoint; EndpointError otherwise."""
    text = (text or "").strip()
    if not text:
        raise EndpointError(field, "give a node name or node:gpu")
    if len(text) > MAX_ENDPOINT_CHARS:
        raise EndpointError(field, f"at most {MAX_ENDPOINT_CHARS} characters")
    m = _ENDPOINT.match(text)
    if not m:
        raise EndpointError(field, "expected a node name or node:gpu, e.g. node-3:5")
    node = topo.node_by_name.get(m["node"])
    if node is None:
        raise EndpointError(field, f"no node named {m['node'][:60]!r} in this cluster")
    if m["gpu"] is None:
        return Endpoint(node, None)
    gpu = int(m["gpu"])
    if gpu >= int(topo.node_gpu_count[node]):
        raise EndpointError(field, f"{m['node']} has GPUs 0-{int(topo.node_gpu_count[node]) - 1}, not {gpu}")
    return Endpoint(node, gpu)


def _gpu_name(topo: Topology, g: int) -> str:
    node, index = topo.gpu_key(g)
    return f"{node} GPU {index}"


def _shared_upper(lay: ClusterLayout, lower: str, other: str) -> str | None:
    """The first switch above `lower` that is also above `other` (the ECMP choice drawn)."""
    above = [hi for lo, hi, _, _ in lay.uplinks if lo == lower]
    theirs = {hi for lo, hi, _, _ in lay.uplinks if lo == other}
    return next((s for s in above if s in theirs), above[0] if above else None)


def gpu_path(lay: ClusterLayout, g: int, h: int) -> dict:
    """The route between GPUs g and h as hops (from, to, level, GB/s, us, the link drawn: `nic` or
    `uplink` number, and the point reached), the bottleneck hop and totals; the totals are the
    core's `Topology.path`, which the hops add up to."""
    topo = lay.topology
    path = topo.path(g, h)
    hops: list[dict] = []

    def hop(a, b, level, bw, lat, link=None, point=None, via=None):
        entry = {
            "from": a,
            "to": b,
            "level": level,
            "bw_GBps": round(float(bw), 4),
            "latency_us": round(float(lat), 4),
            "link": link,
            "point": point,
        }
        if via is not None:
            entry["via"] = via  # a drawn corner before `point`: the NIC on a GPU's cable
        hops.append(entry)

    start = [round(float(lay.gpu_x[g]), 3), round(float(lay.gpu_y[g]), 3)]
    end = [round(float(lay.gpu_x[h]), 3), round(float(lay.gpu_y[h]), 3)]
    if g == h:
        pass
    elif topo.gpu_domain[g] == topo.gpu_domain[h]:
        hop(_gpu_name(topo, g), _gpu_name(topo, h), "nvlink", path.bw_GBps, path.latency_us, None, end)
    elif topo.gpu_leaf[g] < 0 or topo.gpu_leaf[h] < 0:
        hop(_gpu_name(topo, g), _gpu_name(topo, h), "none", 0.0, math.inf, None, end)
    else:
        lg, lh = int(topo.gpu_leaf[g]), int(topo.gpu_leaf[h])
        leaf_g, leaf_h = topo.leaf_names[lg], topo.leaf_names[lh]
        nic_g, nic_h = int(lay.gpu_nic[g]), int(lay.gpu_nic[h])

        def at(switch):
            return [round(lay.switch_x[switch], 3), round(lay.switch_y[switch], 3)]

        def nic_name(nic):
            return f"{topo.nodes[int(lay.nic_node[nic])].name} {lay.nic_names[nic]}"

        def nic_at(nic):
            return [round(float(lay.nic_x[nic]), 3), geo.Y_NIC]

        hop(
            f"{_gpu_name(topo, g)} ({nic_name(nic_g)})",
            leaf_g,
            "leaf",
            topo.gpu_nic_bw[g],
            topo.gpu_nic_latency[g],
            {"nic": nic_g},
            at(leaf_g),
            nic_at(nic_g),
        )
        if lg != lh:
            up_index = {(lo, hi): i for i, (lo, hi, _, _) in enumerate(lay.uplinks)}
            spine_g = _shared_upper(lay, leaf_g, leaf_h)
            pg, ph = int(topo.leaf_pod[lg]), int(topo.leaf_pod[lh])
            spine_h = spine_g if pg == ph else _shared_upper(lay, leaf_h, leaf_h)
            hop(
                leaf_g,
                spine_g,
                "spine",
                topo.leaf_spine_bw[lg],
                topo.leaf_spine_latency[lg],
                {"uplink": up_index.get((leaf_g, spine_g))},
                at(spine_g),
            )
            if pg != ph:
                core = _shared_upper(lay, spine_g, spine_h)
                hop(
                    spine_g,
                    core,
                    "core",
                    topo.pod_core_bw[pg],
                    topo.pod_core_latency[pg],
                    {"uplink": up_index.get((spine_g, core))},
                    at(core),
                )
                hop(
                    core,
                    spine_h,
                    "core",
                    topo.pod_core_bw[ph],
                    topo.pod_core_latency[ph],
                    {"uplink": up_index.get((spine_h, core))},
                    at(spine_h),
                )
            hop(
                spine_h,
                leaf_h,
                "spine",
                topo.leaf_spine_bw[lh],
                topo.leaf_spine_latency[lh],
                {"uplink": up_index.get((leaf_h, spine_h))},
                at(leaf_h),
            )
        hop(
            leaf_h,
            f"{_gpu_name(topo, h)} ({nic_name(nic_h)})",
            "leaf",
            topo.gpu_nic_bw[h],
            topo.gpu_nic_latency[h],
            {"nic": nic_h},
            end,
            nic_at(nic_h),
        )
    bottleneck = min(range(len(hops)), key=lambda i: hops[i]["bw_GBps"]) if hops else None
    return {
        "a": _gpu_name(topo, g),
        "b": _gpu_name(topo, h),
        "level": path.level if g != h else "same GPU",
        "bw_GBps": round(path.bw_GBps, 4),
        "latency_us": None if not math.isfinite(path.latency_us) else round(path.latency_us, 4),
        "bottleneck": bottleneck,
        "start": start,
        "hops": hops,
    }


def endpoints_path(lay: ClusterLayout, a: Endpoint, b: Endpoint) -> dict:
    """The path between two endpoints. For two GPUs, their path; with a node at either end, the
    path between the GPUs of the same index on both nodes (one per rail), the slowest one shown
    hop by hop and every pair summarised in `pairs`."""
    topo = lay.topology

    def gids(e: Endpoint) -> list[int]:
        first = int(topo.node_first_gid[e.node])
        if e.gpu is not None:
            return [first + e.gpu]
        return [first + i for i in range(int(topo.node_gpu_count[e.node]))]

    ga, gb = gids(a), gids(b)
    if len(ga) > 1 and len(gb) > 1:
        pairs = list(zip(ga, gb, strict=False))
    else:
        pairs = [(x, y) for x in ga for y in gb]
    summaries = []
    for x, y in pairs:
        p = topo.path(x, y)
        summaries.append(
            {
                "a": _gpu_name(topo, x),
                "b": _gpu_name(topo, y),
                "level": p.level,
                "bw_GBps": round(p.bw_GBps, 4),
                "latency_us": None if not math.isfinite(p.latency_us) else round(p.latency_us, 4),
            }
        )
    worst = min(range(len(pairs)), key=lambda i: (summaries[i]["bw_GBps"], i))
    out = gpu_path(lay, *pairs[worst])
    out["pairs"] = summaries
    return out


def leaf_matrix(lay: ClusterLayout, leaf: str) -> dict:
    """Node-pair bandwidth (GB/s), latency (us) and level between GPU 0 of every node whose first
    NIC is on `leaf` (at most MATRIX_MAX_NODES nodes; `truncated` says when more). KeyError for
    an unknown leaf."""
    topo = lay.topology
    li = topo.leaf_by_name[leaf]
    nodes = np.flatnonzero(topo.node_leaf == li)
    truncated = nodes.size > MATRIX_MAX_NODES
    nodes = nodes[:MATRIX_MAX_NODES]
    first = topo.node_first_gid[nodes]
    bw, lat, level = [], [], []
    for g in first.tolist():
        row_bw, row_lat, row_level = [], [], []
        for h in first.tolist():
            if g == h and topo.node_gpu_count[topo.gpu_node[g]] > 1:
                h = g + 1
            p = topo.path(g, h)
            row_bw.append(round(p.bw_GBps, 4))
            row_lat.append(None if not math.isfinite(p.latency_us) else round(p.latency_us, 4))
            row_level.append(p.level)
        bw.append(row_bw)
        lat.append(row_lat)
        level.append(row_level)
    return {
        "leaf": leaf,
        "nodes": [topo.nodes[i].name for i in nodes.tolist()],
        "bw_GBps": bw,
        "latency_us": lat,
        "level": level,
        "truncated": bool(truncated),
        "note": "GPU 0 of each node to GPU 0 of the other; the diagonal is GPU 0 to GPU 1 on one node",
    }

"""Plotly figure of a cluster: the layered topology graph with every overlay, sent once.

Per-GPU layers use WebGL (`scattergl`) past WEBGL_ABOVE_GPUS, SVG below.

`cluster_figure(layout, jobs)` returns the figure (plain Plotly JSON: `data` and `layout`) and
the client data that `static/dashboard/cluster.js` uses to switch overlays, aggregate per leaf
when zoomed out and highlight a job, all without asking the server again. Each trace carries
`meta.role` so the script knows what to show. The network layers are in `network_traces`, the
client half in `clientdata`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from apps.dashboard import layout as geo
from apps.dashboard.clientdata import client_data
from apps.dashboard.jobview import JobView
from apps.dashboard.network_traces import (
    LOAD_BUCKETS,
    cable_traces,
    domain_traces,
    leaf_loads,
    nic_and_node_traces,
    switch_traces,
    uplink_traces,
)
from apps.dashboard.traces import FREE_COLOR, HIGHLIGHT_COLOR, JOB_PALETTE, lines, markers, rounded

MAX_JOB_TRACES = 40  # more jobs than this share one "other jobs" trace, to keep the legend usable
AGGREGATE_ABOVE_NODES = 192  # the script aggregates per leaf when more nodes than this are in view
# Above this many GPUs the per-GPU layers are drawn with WebGL; SVG draws smaller clusters faster
# and the few hundred switches, cables and aggregate squares at any size.
WEBGL_ABOVE_GPUS = 4096
DETAIL_ROLES = frozenset({"gpu-free", "gpu-job", "gpu-metric", "wire", "domain", "nic", "node", "hl-gpus"})

OVERLAYS = (
    ("placement", "Job placement"),
    ("mfu", "MFU"),
    ("util", "GPU utilisation"),
    ("comm", "Comm share"),
    ("load", "Leaf-spine link load (predicted)"),
)


@dataclass(frozen=True)
class ClusterFigure:
    """The figure as Plotly JSON and the client data for the overlay script."""

    figure: dict
    client: dict


def _metric_values(jobs: Sequence[JobView], busy_job: np.ndarray, attr: str) -> list:
    per_job = np.array([np.nan if getattr(j, attr) is None else float(getattr(j, attr)) for j in jobs])
    vals = per_job[busy_job] if busy_job.size else np.zeros(0)
    return [None if not np.isfinite(v) else round(float(v), 4) for v in vals]


def cluster_figure(lay: geo.ClusterLayout, jobs: Sequence[JobView]) -> ClusterFigure:
    """The layered cluster graph with placement, predicted metrics, link load, the per-leaf
    aggregate and an empty highlight layer (filled by the client script)."""
    topo = lay.topology
    n = topo.n_gpus
    gpu_job = np.full(n, -1, dtype=np.int64)
    gpu_rank = np.full(n, -1, dtype=np.int64)
    for j, job in enumerate(jobs):
        g = np.asarray(job.gids, dtype=np.int64)
        gpu_job[g] = j
        gpu_rank[g] = np.arange(g.size)
    data: list[dict] = []

    loads = leaf_loads(lay, jobs)
    data += uplink_traces(lay, loads)
    data += cable_traces(lay)
    data += domain_traces(lay)
    data += switch_traces(lay, loads)
    data += nic_and_node_traces(lay, gpu_job)

    job_colors = [JOB_PALETTE[j % len(JOB_PALETTE)] for j in range(len(jobs))]
    data += gpu_traces(lay, jobs, gpu_job, job_colors)
    busy = np.flatnonzero(gpu_job >= 0)
    metrics = {
        k: _metric_values(jobs, gpu_job[busy], attr)
        for k, attr in (("mfu", "mfu"), ("util", "util"), ("comm", "comm_share"))
    }
    data.append(_metric_trace(lay, busy, metrics["mfu"]))
    agg, agg_metrics = _aggregate_trace(lay, jobs, gpu_job, metrics)
    data.append(agg)
    # Highlight layer, filled by the client script when a job is picked.
    data.append(lines("highlighted links", [], [], HIGHLIGHT_COLOR, 3, "hl-links"))
    ring = {
        "color": "rgba(0,0,0,0)",
        "size": 11,
        "symbol": "square-open",
        "line": {"width": 2, "color": HIGHLIGHT_COLOR},
    }
    data.append(markers("highlighted job", [], [], None, "hl-gpus", marker=ring))

    if topo.n_gpus > WEBGL_ABOVE_GPUS:
        for trace in data:
            if trace["meta"]["role"] in DETAIL_ROLES:
                trace["type"] = "scattergl"
    figure = {"data": data, "layout": _cluster_layout(lay)}
    client = client_data(
        lay,
        jobs,
        job_colors,
        gpu_job,
        gpu_rank,
        metrics,
        agg_metrics,
        loads,
        overlays=OVERLAYS,
        aggregate_above=AGGREGATE_ABOVE_NODES,
    )
    return ClusterFigure(figure=figure, client=client)


def _gpu_marker(color) -> dict:
    # The client resizes GPU squares to the zoom; 7 px is the size before the first draw.
    return {"color": color, "size": 7, "symbol": "square"}


def gpu_traces(
    lay: geo.ClusterLayout, jobs: Sequence[JobView], gpu_job: np.ndarray, job_colors
) -> list[dict]:
    """Free GPUs in grey, then one trace per job (the legend lists the jobs) and, past
    MAX_JOB_TRACES, one trace for the rest. Hover text is built by the client; `customdata`
    holds each point's gid."""
    free = np.flatnonzero(gpu_job < 0)
    out = [
        markers(
            f"free ({free.size})",
            lay.gpu_x[free],
            lay.gpu_y[free],
            [],
            "gpu-free",
            marker=_gpu_marker(FREE_COLOR),
            legend=True,
            customdata=free.tolist(),
        )
    ]
    for j, job in enumerate(jobs[:MAX_JOB_TRACES]):
        g = np.asarray(job.gids, dtype=np.int64)
        t = markers(
            job.label,
            lay.gpu_x[g],
            lay.gpu_y[g],
            [],
            "gpu-job",
            marker=_gpu_marker(job_colors[j]),
            legend=True,
            customdata=g.tolist(),
        )
        t["meta"]["job"] = j
        out.append(t)
    if len(jobs) > MAX_JOB_TRACES:
        rest = np.flatnonzero(gpu_job >= MAX_JOB_TRACES)
        out.append(
            markers(
                f"{len(jobs) - MAX_JOB_TRACES} more jobs",
                lay.gpu_x[rest],
                lay.gpu_y[rest],
                [],
                "gpu-job",
                marker=_gpu_marker([job_colors[j] for j in gpu_job[rest]]),
                legend=True,
                customdata=rest.tolist(),
            )
        )
    return out


def _metric_trace(lay: geo.ClusterLayout, busy: np.ndarray, values: list) -> dict:
    """The busy GPUs coloured by a predicted metric (0..1); hidden until a metric overlay."""
    marker = _gpu_marker(values)
    marker.update(
        colorscale="Viridis",
        cmin=0,
        cmax=1,
        showscale=True,
        colorbar={"title": {"text": "MFU (predicted)"}, "thickness": 12, "len": 0.5, "x": 1.0, "y": 0.3},
    )
    return markers(
        "busy GPUs",
        lay.gpu_x[busy],
        lay.gpu_y[busy],
        [],
        "gpu-metric",
        marker=marker,
        customdata=busy.tolist(),
        visible=False,
    )


def _aggregate_trace(lay: geo.ClusterLayout, jobs: Sequence[JobView], gpu_job: np.ndarray, metrics: dict):
    """One square per leaf group for the zoomed-out view, and its value per overlay: the busy
    share for placement, the mean over busy GPUs for each metric (None: no busy GPU)."""
    topo = lay.topology
    n_groups = len(lay.group_names)
    group_of_gpu = lay.group_of_node[topo.gpu_node]
    busy = np.flatnonzero(gpu_job >= 0)
    busy_group = group_of_gpu[busy]
    g_total = np.bincount(group_of_gpu, minlength=n_groups)
    g_busy = np.bincount(busy_group, minlength=n_groups)
    values = {"placement": rounded(g_busy / np.maximum(g_total, 1))}
    for key, vals in metrics.items():
        v = np.array([np.nan if x is None else x for x in vals], dtype=float)
        ok = np.isfinite(v)
        total = np.bincount(busy_group[ok], weights=v[ok], minlength=n_groups)
        count = np.bincount(busy_group[ok], minlength=n_groups)
        values[key] = [round(float(a / b), 4) if b else None for a, b in zip(total, count, strict=True)]
    text = []
    for g in range(n_groups):
        in_group = gpu_job[busy][busy_group == g]
        counts = np.bincount(in_group, minlength=len(jobs)) if in_group.size else np.zeros(0, dtype=int)
        top = np.argsort(-counts)[:4] if counts.size else []
        parts = [f"{jobs[j].label}: {int(counts[j])}" for j in top if counts[j] > 0]
        text.append(
            f"<b>{lay.group_names[g]}</b><br>{int(g_total[g])} GPUs, {int(g_busy[g])} busy"
            + ("<br>" + "<br>".join(parts) if parts else "")
            + "<br><i>click to zoom in</i>"
        )
    marker = {
        "color": values["placement"],
        "size": 16,
        "symbol": "square",
        "colorscale": [[0, FREE_COLOR], [1, "#1f77b4"]],
        "cmin": 0,
        "cmax": 1,
        "showscale": False,
        "line": {"width": 1, "color": "#455a64"},
    }
    trace = markers(
        "per-leaf aggregate",
        lay.group_x,
        np.full(n_groups, geo.Y_AGG),
        text,
        "agg",
        marker=marker,
        customdata=list(range(n_groups)),
        visible=False,
    )
    return trace, values


def _cluster_layout(lay: geo.ClusterLayout) -> dict:
    gpu_mid = (geo.Y_GPU_TOP + float(lay.gpu_y.min())) / 2 if lay.gpu_y.size else geo.Y_GPU_TOP
    ticks = [(geo.Y_LEAF, "leaf"), (geo.Y_NIC, "NICs"), (gpu_mid, "GPUs")]
    tiers = {s.tier for s in lay.topology.switches}
    if "spine" in tiers:
        ticks.insert(0, (geo.Y_SPINE, "spine"))
    if "core" in tiers:
        ticks.insert(0, (geo.Y_CORE, "core"))
    y_low = float(lay.node_y0.min()) - 0.4 if lay.node_y0.size else 0.0
    y_top = geo.Y_CORE if "core" in tiers else geo.Y_SPINE if "spine" in tiers else geo.Y_LEAF
    return {
        "height": 640,
        "margin": {"l": 60, "r": 20, "t": 30, "b": 20},
        "dragmode": "zoom",
        "hovermode": "closest",
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "xaxis": {"visible": False, "range": [-1.5, lay.width + 1.5], "zeroline": False},
        "yaxis": {
            "range": [y_low, y_top + 0.5],
            "fixedrange": True,
            "tickvals": [t for t, _ in ticks],
            "ticktext": [s for _, s in ticks],
            "showgrid": False,
            "zeroline": False,
        },
        "legend": {"orientation": "v", "x": 1.01, "y": 1, "itemclick": False, "itemdoubleclick": False},
        "showlegend": True,
    }


__all__ = [
    "AGGREGATE_ABOVE_NODES",
    "JOB_PALETTE",
    "LOAD_BUCKETS",
    "OVERLAYS",
    "ClusterFigure",
    "cluster_figure",
    "leaf_loads",
]

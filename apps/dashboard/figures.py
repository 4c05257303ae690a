"""Plotly figure of a cluster: the layered topology graph with every overlay, sent once.

`cluster_figure(layout, jobs)` returns the figure (plain Plotly JSON: `data` and `layout`) and
the client data that `static/dashboard/cluster.js` uses to place the points, switch overlays,
show the per-leaf-group bars when zoomed out, write hover text and highlight a job, all without
asking the server again. Per-GPU, per-NIC, per-node and per-link traces carry ids (customdata)
or `meta.fill`; their coordinates come once, in the client data. Each trace carries `meta.role`
so the script knows what to show. The network layers are in `network_traces`, link loads in
`links`, the client half in `clientdata`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from apps.dashboard import layout as geo
from apps.dashboard.clientdata import OUTLINE_PAD_X, OUTLINE_PAD_Y, client_data
from apps.dashboard.jobview import JobView
from apps.dashboard.links import link_loads
from apps.dashboard.network_traces import (
    LOAD_BUCKETS,
    cable_traces,
    domain_traces,
    link_hover_trace,
    nic_and_node_traces,
    switch_traces,
    uplink_traces,
)
from apps.dashboard.traces import (
    FREE_COLOR,
    HIGHLIGHT_COLOR,
    JOB_PALETTE,
    JOB_STYLES,
    boxes,
    job_style,
    lines,
    markers,
    rounded,
)

MAX_JOB_TRACES = 40  # more jobs than this share one "other jobs" trace, to keep the legend usable
AGGREGATE_ABOVE_NODES = 192  # the script aggregates per leaf when more nodes than this are in view
# Every layer is SVG: the client hands Plotly only the points near the visible range (at most
# about twice AGGREGATE_ABOVE_NODES nodes' worth once zoomed in), where SVG draws faster than
# WebGL sets up, above all with software rendering.
FREE_WHOLE_COLOR = "#eef0f2"  # free GPUs on wholly free nodes, in the zoomed-out bars

OVERLAYS = (
    ("placement", "Job placement"),
    ("mfu", "MFU"),
    ("util", "GPU utilisation"),
    ("comm", "Comm share"),
    ("load", "Link load (GB/s, % of capacity)"),
)


@dataclass(frozen=True)
class ClusterFigure:
    """The figure as Plotly JSON and the client data for the overlay script."""

    figure: dict
    client: dict
    styles: tuple[int, ...] = ()

    def job_color(self, j: int) -> str:
        """The colour of job number `j` (as in the legend)."""
        return job_style(self.styles[j])[0]


def _metric_values(jobs: Sequence[JobView], busy_job: np.ndarray, attr: str) -> list:
    per_job = np.array([np.nan if getattr(j, attr) is None else float(getattr(j, attr)) for j in jobs])
    vals = np.round(per_job[busy_job], 4) if busy_job.size else np.zeros(0)
    return [None if v != v else v for v in vals.tolist()]  # NaN (no prediction) -> None


def job_styles(lay: geo.ClusterLayout, jobs: Sequence[JobView]) -> tuple[int, ...]:
    """A style number per job (colour and mark, see `traces.job_style`), chosen greedily in job
    order so that jobs whose leaf groups lie within a zoom-in's reach of each other differ: any
    view of AGGREGATE_ABOVE_NODES nodes or fewer shows each style once, up to JOB_STYLES jobs."""
    n_groups = len(lay.group_names)
    per_group = np.bincount(lay.group_of_node, minlength=n_groups)
    reach = max(1, math.ceil(AGGREGATE_ABOVE_NODES / max(1.0, float(np.median(per_group)))))
    topo = lay.topology
    on_group: dict[int, list[int]] = {}
    styles: list[int] = []
    for j, job in enumerate(jobs):
        groups = np.unique(lay.group_of_node[topo.gpu_node[np.asarray(job.gids, dtype=np.int64)]])
        near: set[int] = set()
        for g in groups.tolist():
            for h in range(g - reach, g + reach + 1):
                near.update(on_group.get(h, ()))
        used = np.bincount([styles[k] for k in near], minlength=JOB_STYLES)
        styles.append(int(np.argmin(used)))  # the first unused style, else the least used
        for g in groups.tolist():
            on_group.setdefault(g, []).append(j)
    return tuple(styles)


# How each node state shows on the graph: a mark above the node (legend entry per state).
NODE_MARKS = {
    "down": ("down", "x", "#c62828"),
    "drained": ("drained", "square-x-open", "#ef6c00"),
    "draining": ("draining", "hourglass", "#f9a825"),
    "no_agent": ("no agent", "circle-open", "#78909c"),
    "unhealthy": ("unhealthy GPU", "diamond-x", "#ad1457"),
}
OUT_OF_SERVICE = ("down", "drained", "draining")
OUT_COLOR = "#90a4ae"  # idle GPUs of nodes that take no placements
UNHEALTHY_COLOR = "#ad1457"


def node_marks(lay: geo.ClusterLayout, node_states: dict | None) -> tuple[np.ndarray, np.ndarray, dict]:
    """From `node_states` (by node name: {"state", "reason", "since", "unhealthy"}): the GPUs of
    nodes that take no placements, the GPUs reported unhealthy (boolean masks over gids), and per
    node index its [state, reason, since as ISO text, unhealthy GPU indexes] for the client."""
    topo = lay.topology
    out = np.zeros(topo.n_gpus, dtype=bool)
    bad = np.zeros(topo.n_gpus, dtype=bool)
    shown: dict[str, list] = {}
    if not node_states:
        return out, bad, shown
    index = {n.name: i for i, n in enumerate(topo.nodes)}
    first = np.concatenate([[0], np.cumsum(topo.node_gpu_count)[:-1]]).astype(np.int64)
    for name, st in node_states.items():
        i = index.get(name)
        if i is None:
            continue
        count = int(topo.node_gpu_count[i])
        if st["state"] in OUT_OF_SERVICE:
            out[first[i] : first[i] + count] = True
        for g in st.get("unhealthy", ()):
            if 0 <= g < count:
                bad[first[i] + g] = True
        since = st.get("since")
        shown[str(i)] = [
            st["state"],
            st.get("reason", ""),
            since.isoformat() if since else None,
            list(st.get("unhealthy", ())),
        ]
    return out, bad, shown


def _no_agent_only(shown: dict) -> list[int]:
    """Nodes whose only mark is "no agent" (sent as a plain list: a cluster without agents has
    thousands of them)."""
    return sorted(int(i) for i, v in shown.items() if v[0] == "no_agent" and not v[1] and not v[3])


def _node_state_hover(name: str, key: str, label: str, entry: list) -> str:
    """A node's hover text for its mark `key`: the state and since when, or the unhealthy GPUs,
    and why."""
    _state, reason, since, gpus = entry
    line = f"<b>{name}</b> · {label}"
    if key == "unhealthy":
        line += ": GPU " + ", ".join(str(g) for g in gpus)
    elif since:
        line += f" since {since[:16].replace('T', ' ')} UTC"
    if reason and key != "unhealthy":
        line += f"<br>{reason[:120]}"
    return line + "<br><i>click for the node's page</i>"


def node_state_traces(lay: geo.ClusterLayout, shown: dict) -> list[dict]:
    """One trace per node state present, its mark above each such node, named with the count;
    hover says the state, since when and why, a click opens the node's page."""
    topo = lay.topology
    out = []
    for key, (label, symbol, color) in NODE_MARKS.items():
        if key == "unhealthy":
            nodes = [int(i) for i, v in shown.items() if v[3]]
        else:
            nodes = [int(i) for i, v in shown.items() if v[0] == key]
        if not nodes:
            continue
        nodes.sort()
        # "No agent" has no hover text of its own: the node's hover says it (thousands on an
        # agentless cluster).
        text = None
        if key != "no_agent":
            text = [_node_state_hover(topo.nodes[i].name, key, label, shown[str(i)]) for i in nodes]
        y_off = 0.1 if key == "unhealthy" else 0.0
        t = markers(
            f"{label} ({len(nodes)} node{'s' if len(nodes) != 1 else ''})",
            lay.node_x[nodes],
            np.full(len(nodes), geo.Y_NODE + y_off),
            text,
            "node-state",
            marker={"symbol": symbol, "color": color, "size": 11, "line": {"width": 2, "color": color}},
            legend=True,
            customdata=nodes,
        )
        t["meta"]["state"] = key
        out.append(t)
    return out


def cluster_figure(
    lay: geo.ClusterLayout,
    jobs: Sequence[JobView],
    node_states: dict | None = None,
    stopping: np.ndarray | None = None,
) -> ClusterFigure:
    """The layered cluster graph with placement, predicted metrics, link loads, the zoomed-out
    bars, node states (`node_states` by node name, see `node_marks`), GPUs still held by ranks
    that are stopping (`stopping`, a mask over gids: not free) and empty highlight layers
    (filled by the client script)."""
    topo = lay.topology
    n = topo.n_gpus
    gpu_job = np.full(n, -1, dtype=np.int64)
    gpu_rank = np.full(n, -1, dtype=np.int64)
    for j, job in enumerate(jobs):
        g = np.asarray(job.gids, dtype=np.int64)
        gpu_job[g] = j
        gpu_rank[g] = np.arange(g.size)
    out_gpus, bad_gpus, shown = node_marks(lay, node_states)
    held = np.zeros(n, dtype=bool) if stopping is None else (stopping & (gpu_job < 0))
    data: list[dict] = []

    loads = link_loads(lay, jobs)
    styles = job_styles(lay, jobs)
    looks = [job_style(s) for s in styles]
    data += uplink_traces(lay, loads)
    data += cable_traces(lay, loads)
    data += domain_traces(lay)
    data += switch_traces(lay, loads)
    data += nic_and_node_traces(lay)
    data.append(link_hover_trace())

    data += gpu_traces(lay, jobs, gpu_job, looks, out_gpus, bad_gpus, held)
    busy = np.flatnonzero(gpu_job >= 0)
    metrics = {
        k: _metric_values(jobs, gpu_job[busy], attr)
        for k, attr in (("mfu", "mfu"), ("util", "util"), ("comm", "comm_share"))
    }
    data.append(_metric_trace(lay, busy, metrics["mfu"]))
    data += outline_traces(lay, jobs, looks)
    bars, bar_data = bar_trace(lay, jobs, gpu_job, looks, out_gpus | bad_gpus | held)
    data += bars
    data += node_state_traces(lay, shown)
    # Highlight and path layers, filled by the client script.
    data.append(lines("highlighted links", [], [], HIGHLIGHT_COLOR, 3, "hl-links"))
    data.append(lines("highlighted job", [], [], HIGHLIGHT_COLOR, 2.5, "hl-outline"))
    path = lines("path", [], [], "#0072B2", 4, "hl-path")
    path["mode"] = "lines+markers"
    path["marker"] = {"size": 9, "color": "#0072B2", "symbol": "circle"}
    data.append(path)

    figure = {"data": data, "layout": _cluster_layout(lay)}
    client = client_data(
        lay,
        jobs,
        looks,
        gpu_job,
        gpu_rank,
        metrics,
        loads,
        bar_data,
        overlays=OVERLAYS,
        aggregate_above=AGGREGATE_ABOVE_NODES,
    )
    plain = _no_agent_only(shown)
    client["node_no_agent"] = plain
    plain_set = set(plain)
    client["node_state"] = {i: v for i, v in shown.items() if int(i) not in plain_set}
    return ClusterFigure(figure=figure, client=client, styles=styles)


def _gpu_marker(color, symbol="square") -> dict:
    # The client resizes GPU squares to the zoom; 7 px is the size before the first draw.
    return {"color": color, "size": 7, "symbol": symbol, "line": {"width": 0, "color": "#333333"}}


def gpu_traces(
    lay: geo.ClusterLayout,
    jobs: Sequence[JobView],
    gpu_job: np.ndarray,
    looks,
    out_gpus: np.ndarray | None = None,
    bad_gpus: np.ndarray | None = None,
    held_gpus: np.ndarray | None = None,
) -> list[dict]:
    """Free GPUs in grey; idle GPUs of nodes that take no placements (`out_gpus`), idle GPUs
    reported unhealthy (`bad_gpus`) and GPUs still held by ranks that are stopping (`held_gpus`)
    apart, not counted free; then one trace per job in its
    colour and mark (the legend lists the jobs) and, past MAX_JOB_TRACES, one trace for the rest.
    `customdata` holds each point's gid; the client places the points and builds their hover
    text from the per-GPU data."""
    idle = gpu_job < 0
    held = idle & (held_gpus if held_gpus is not None else False)
    bad = idle & (bad_gpus if bad_gpus is not None else False) & ~held
    out_of_service = idle & (out_gpus if out_gpus is not None else False) & ~bad & ~held
    free = np.flatnonzero(idle & ~bad & ~out_of_service & ~held)
    out = [
        markers(
            f"free ({free.size})",
            [],
            [],
            [],
            "gpu-free",
            marker=_gpu_marker(FREE_COLOR),
            legend=True,
            customdata=free.tolist(),
        )
    ]
    for mask, name, color, symbol in (
        (out_of_service, "not schedulable (down, drained or draining node)", OUT_COLOR, "square-x"),
        (bad, "unhealthy", UNHEALTHY_COLOR, "x"),
        (held, "stopping (a rank that has not exited yet holds it)", OUT_COLOR, "hourglass"),
    ):
        if mask.any():
            t = markers(
                f"{name} ({int(mask.sum())})",
                [],
                [],
                [],
                "gpu-free",
                marker=_gpu_marker(color, symbol),
                legend=True,
                customdata=np.flatnonzero(mask).tolist(),
            )
            t["meta"]["unavailable"] = True
            out.append(t)
    for j, job in enumerate(jobs[:MAX_JOB_TRACES]):
        g = np.asarray(job.gids, dtype=np.int64)
        color, symbol, _ = looks[j]
        t = markers(
            job.label,
            [],
            [],
            [],
            "gpu-job",
            marker=_gpu_marker(color, symbol),
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
                [],
                [],
                [],
                "gpu-job",
                marker=_gpu_marker(
                    [looks[j][0] for j in gpu_job[rest]], [looks[j][1] for j in gpu_job[rest]]
                ),
                legend=True,
                customdata=rest.tolist(),
            )
        )
    return out


def job_boxes(lay: geo.ClusterLayout, gids) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x0, x1, y0, y1) of one box per node around the given GPUs: a job's outline."""
    g = np.asarray(gids, dtype=np.int64)
    if not g.size:
        return (np.zeros(0),) * 4
    nodes, inv = np.unique(lay.topology.gpu_node[g], return_inverse=True)
    x, y = lay.gpu_x[g], lay.gpu_y[g]
    x0 = np.full(nodes.size, np.inf)
    x1 = np.full(nodes.size, -np.inf)
    y0 = np.full(nodes.size, np.inf)
    y1 = np.full(nodes.size, -np.inf)
    np.minimum.at(x0, inv, x)
    np.maximum.at(x1, inv, x)
    np.minimum.at(y0, inv, y)
    np.maximum.at(y1, inv, y)
    return x0 - OUTLINE_PAD_X, x1 + OUTLINE_PAD_X, y0 - OUTLINE_PAD_Y, y1 + OUTLINE_PAD_Y


def outline_traces(lay: geo.ClusterLayout, jobs: Sequence[JobView], looks) -> list[dict]:
    """One outline per job in its colour around its GPUs on each node, shown with the metric
    overlays so that the colours of a metric still say which job is which; each has its legend
    entry, so the job legend stays (and the drawing keeps its width) under a metric overlay."""
    out = []
    rest: list[int] = []
    for j, job in enumerate(jobs):
        if j >= MAX_JOB_TRACES:
            rest.extend(job.gids)
            continue
        # In the legend too: under a metric overlay the outlines stand for the jobs there.
        t = lines(job.label, *boxes(*job_boxes(lay, job.gids)), looks[j][0], 2, "job-outline", legend=True)
        t["meta"]["job"] = j
        t["visible"] = False
        out.append(t)
    if rest:
        t = lines(
            f"{len(jobs) - MAX_JOB_TRACES} more jobs",
            *boxes(*job_boxes(lay, rest)),
            "#555555",
            1.5,
            "job-outline",
            legend=True,
        )
        t["visible"] = False
        out.append(t)
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
        [],
        [],
        [],
        "gpu-metric",
        marker=marker,
        customdata=busy.tolist(),
        visible=False,
    )


def bar_trace(
    lay: geo.ClusterLayout,
    jobs: Sequence[JobView],
    gpu_job: np.ndarray,
    looks,
    unavailable: np.ndarray | None = None,
):
    """The zoomed-out view: one stacked bar per leaf group, the height of its GPUs, in segments
    per job (largest first, in the job's colour and hatch), then the free GPUs on partly busy
    nodes and on top the free GPUs on wholly free nodes (the largest block a whole-node job can
    take there), with each group's free count above its bar; idle GPUs that take no placements
    (`unavailable`: down, drained or draining nodes, unhealthy GPUs, GPUs whose ranks are still
    stopping) are a dark segment of their
    own, not free. Returns the two traces and the segments (group, job or -1/-2/-3, GPUs) for
    the client."""
    topo = lay.topology
    n_groups = len(lay.group_names)
    group_of_gpu = lay.group_of_node[topo.gpu_node]
    total = np.bincount(group_of_gpu, minlength=n_groups)
    off = (gpu_job < 0) & (unavailable if unavailable is not None else False)
    gpu_job = np.where(off, -3, gpu_job)
    n_off = np.bincount(group_of_gpu[off], minlength=n_groups)
    free_on_node = np.bincount(topo.gpu_node[gpu_job == -1], minlength=len(topo.nodes))
    whole = free_on_node == topo.node_gpu_count
    whole_gpus = np.bincount(lay.group_of_node, weights=np.where(whole, free_on_node, 0), minlength=n_groups)
    whole_nodes = np.bincount(lay.group_of_node, weights=whole.astype(float), minlength=n_groups)
    most_on_node = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(most_on_node, lay.group_of_node, free_on_node)
    free = np.bincount(group_of_gpu[gpu_job == -1], minlength=n_groups)
    busy = gpu_job >= 0
    pairs = group_of_gpu[busy] * (len(jobs) + 1) + gpu_job[busy]
    keys, counts = np.unique(pairs, return_counts=True)
    per_group: dict[int, list[tuple[int, int]]] = {}
    for key, c in zip(keys.tolist(), counts.tolist(), strict=True):
        per_group.setdefault(key // (len(jobs) + 1), []).append((key % (len(jobs) + 1), c))
    bottom = float(lay.node_y0.min()) if lay.node_y0.size else 0.0  # bars fill the GPU band
    band = geo.Y_NODE - bottom
    width = (
        np.array(
            [
                lay.node_x1[lay.group_of_node == g].max() - lay.node_x0[lay.group_of_node == g].min()
                for g in range(n_groups)
            ]
        )
        * 0.8
    )
    xs, base, height, colors, hatch, text, seg_group, seg_job, seg_count = ([] for _ in range(9))
    for g in range(n_groups):
        y = bottom
        scale = band / max(1, int(total[g]))
        head = f"<b>{lay.group_names[g]}</b> · {int(total[g])} GPUs, {int(free[g])} free"
        block = (
            f"largest free block: {int(whole_nodes[g])} whole nodes ({int(whole_gpus[g])} GPUs); "
            f"most free on one node: {int(most_on_node[g])}"
        )
        rows = sorted(per_group.get(g, []), key=lambda jc: (-jc[1], jc[0]))
        partial = int(free[g] - whole_gpus[g])
        rows += [(-3, int(n_off[g])), (-1, partial), (-2, int(whole_gpus[g]))]
        for j, c in rows:
            if c <= 0:
                continue
            xs.append(lay.group_x[g])
            base.append(y)
            height.append(c * scale)
            y += c * scale
            if j >= 0:
                colors.append(looks[j][0])
                hatch.append(looks[j][2])
                text.append(f"{head}<br>{jobs[j].label}: {c} GPUs here, {len(jobs[j].gids)} in all")
            elif j == -3:
                colors.append(OUT_COLOR)
                hatch.append("x")
                text.append(
                    f"{head}<br>not schedulable (down, drained, draining, unhealthy or still stopping): {c} GPUs"
                )
            else:
                colors.append(FREE_COLOR if j == -1 else FREE_WHOLE_COLOR)
                hatch.append("")
                kind = "on partly busy nodes" if j == -1 else "on wholly free nodes"
                text.append(f"{head}<br>free {kind}: {c} GPUs<br>{block}")
            seg_group.append(g)
            seg_job.append(j)
            seg_count.append(c)
    trace = {
        "type": "bar",
        "name": "GPUs per leaf group",
        "x": rounded(xs),
        "base": rounded(base),
        "y": rounded(height),
        "width": rounded(width[seg_group] if seg_group else []),
        "marker": {
            "color": colors,
            "pattern": {"shape": hatch, "fgcolor": "#222222", "size": 5, "solidity": 0.25},
            "line": {"width": 0.5, "color": "#455a64"},
        },
        "hovertext": text,
        "hovertemplate": "%{hovertext}<br><i>click to zoom in</i><extra></extra>",
        "customdata": seg_group,
        "showlegend": False,
        "visible": False,
        "meta": {"role": "agg"},
    }
    label = markers(
        "free GPUs per leaf group",
        lay.group_x,
        np.full(n_groups, geo.Y_NODE + 0.12),
        None,
        "agg-label",
        marker={"size": 1},
        customdata=list(range(n_groups)),
        mode="text",
        textfont={"size": 10},
        visible=False,
    )
    label["text"] = [f"{int(f)} free" for f in free]
    return [trace, label], {"group": seg_group, "job": seg_job, "gpus": seg_count}


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
        # Transparent, so the page's theme shows through; the client sets font and axis colours
        # from the page's CSS variables.
        "plot_bgcolor": "rgba(0,0,0,0)",
        "paper_bgcolor": "rgba(0,0,0,0)",
        "barmode": "overlay",
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
    "job_styles",
]

"""The cluster page's first picture: a small SVG drawn on the server from the graph's client data.

It is in the page itself, so the browser paints it with the page, before the plotting library
has loaded: spines (and cores) in a row, one stacked bar per leaf group (its jobs in their colour
and hatch, largest first, then unschedulable, free and wholly free GPUs), and one bundle per
group for all its leaf uplinks, as wide as their capacity and coloured by their total predicted
load, labelled with it. The interactive graph replaces it once drawn. Built from `client_data`'s
output only, so it always agrees with the graph.
"""

from __future__ import annotations

from html import escape

from .figures import FREE_WHOLE_COLOR, OUT_COLOR
from .network_traces import LOAD_BUCKETS
from .traces import FREE_COLOR

SEGMENT_COLORS = {-1: FREE_COLOR, -2: FREE_WHOLE_COLOR, -3: OUT_COLOR}

WIDTH = 1200
HEIGHT = 300
PAD_X = 60
Y_SPINE = 30
Y_CORE = 10
Y_BAR_TOP = 130
Y_BAR_BOTTOM = 280
MAX_SWITCH_MARKS = 64  # more spines than this draw as one band with their count
# The load labels' width per character at their 11px font (an upper bound, in viewBox units) and
# the least room between two of them.
LABEL_CHAR_W = 7.0
LABEL_GAP = 4.0

# Bar hatches as SVG patterns, by the graph's (Plotly) pattern shape.
HATCH_PATHS = {
    "/": "M0,6 L6,0",
    "\\": "M0,0 L6,6",
    "x": "M0,0 L6,6 M0,6 L6,0",
    "-": "M0,3 L6,3",
    "|": "M3,0 L3,6",
    "+": "M0,3 L6,3 M3,0 L3,6",
    ".": "M2.5,3 L3.5,3",
}


def load_color(fraction: float) -> str:
    """The link-load overlay's colour for a load of `fraction` of capacity."""
    for upper, _, color in LOAD_BUCKETS:
        if fraction <= upper:
            return color
    return LOAD_BUCKETS[-1][2]


def gbps(value: float) -> str:
    """GB/s in few digits, TB/s past 1,000."""
    if value >= 1000:
        return f"{value / 1000:.3g} TB/s"
    return f"{value:.3g} GB/s"


def group_uplinks(client: dict) -> list[dict]:
    """Per leaf group: the capacity and predicted load of all its leaves' uplinks (GB/s), their
    count, and the mean x of the switches they reach."""
    links = client["links"]
    switches, tiers = links["switches"], links["tier"]
    leaf_index = {name: i for i, name in enumerate(client["leaf_names"])}
    group_of_leaf: dict[int, int] = {}
    for leaf, group in zip(client["node_leaf"], client["node_group"], strict=True):
        group_of_leaf.setdefault(leaf, group)
    n_groups = len(client["group_names"])
    out = [{"cap": 0.0, "load": 0.0, "count": 0, "upper": set()} for _ in range(n_groups)]
    for i in range(links["n_uplinks"]):
        lo = links["a"][i]
        if tiers[lo] != "leaf":
            continue
        group = group_of_leaf.get(leaf_index.get(switches[lo], -1))
        if group is None:
            continue
        out[group]["cap"] += links["cap"][i]
        out[group]["load"] += links["load"][i]
        out[group]["count"] += 1
        out[group]["upper"].add(links["b"][i])
    return out


def _x_scale(client: dict):
    lo = min(client["group_x0"], default=0.0)
    hi = max(client["group_x1"], default=1.0)
    span = max(hi - lo, 1e-9)
    return lambda x: PAD_X + (x - lo) / span * (WIDTH - 2 * PAD_X)


def _switch_row(names: list[str], y: float, label: str) -> tuple[list[str], dict[int, float]]:
    """Marks for one tier's switches spread over the width; returns the SVG and each switch's x."""
    parts = [f'<text class="ov-tier" x="4" y="{y + 4:.0f}">{label}</text>']
    xs: dict[int, float] = {}
    n = len(names)
    if not n:
        return [], xs
    step = (WIDTH - 2 * PAD_X) / n
    for k, (index, _name) in enumerate(names):
        xs[index] = PAD_X + step * (k + 0.5)
    if n > MAX_SWITCH_MARKS:
        parts.append(
            f'<rect class="ov-switch" x="{PAD_X}" y="{y - 4}" width="{WIDTH - 2 * PAD_X}" height="8">'
            f"<title>{n} {label} switches</title></rect>"
            f'<text class="ov-note" x="{WIDTH / 2:.0f}" y="{y - 7}" text-anchor="middle">{n} {label} switches</text>'
        )
        return parts, xs
    for index, name in names:
        parts.append(
            f'<rect class="ov-switch" x="{xs[index] - 4:.1f}" y="{y - 4}" width="8" height="8">'
            f"<title>{escape(name)}</title></rect>"
        )
    return parts, xs


def overview_svg(client: dict) -> str:
    """The overview as an SVG element (a string safe to put in the page)."""
    x_of = _x_scale(client)
    links = client["links"]
    tiers = links["tier"]
    spines = [(i, n) for i, n in enumerate(links["switches"]) if tiers[i] == "spine"]
    cores = [(i, n) for i, n in enumerate(links["switches"]) if tiers[i] == "core"]
    spine_y = Y_SPINE + (20 if cores else 0)
    core_parts, _ = _switch_row(cores, Y_CORE, "core")
    spine_parts, spine_x = _switch_row(spines, spine_y, "spine")
    groups = client["group_names"]
    totals = [0] * len(groups)
    for g, count in zip(client["bars"]["group"], client["bars"]["gpus"], strict=True):
        totals[g] += count
    tallest = max(totals, default=1) or 1
    band = Y_BAR_BOTTOM - Y_BAR_TOP
    ups = group_uplinks(client)
    bundle_parts: list[str] = []
    if len(spine_x) > 1:
        # The spine row as one bar the bundles end on.
        bundle_parts.append(
            f'<line class="ov-row" x1="{min(spine_x.values()):.1f}" y1="{spine_y}" '
            f'x2="{max(spine_x.values()):.1f}" y2="{spine_y}"/>'
        )
    widest = max((u["cap"] for u in ups), default=0.0) or 1.0
    for g, up in enumerate(ups):
        if not up["count"]:
            continue
        x = x_of((client["group_x0"][g] + client["group_x1"][g]) / 2)
        uppers = [spine_x[b] for b in up["upper"] if b in spine_x]
        top_x = sum(uppers) / len(uppers) if uppers else x
        share = up["load"] / up["cap"] if up["cap"] else 0.0
        width = 1.5 + 6.5 * up["cap"] / widest
        top_y = Y_BAR_BOTTOM - band * totals[g] / tallest
        text = (
            f"{escape(groups[g])}: {up['count']} uplinks, {gbps(up['cap'])}; "
            f"predicted load {gbps(up['load'])} ({share:.0%})"
        )
        bundle_parts.append(
            f'<line class="ov-bundle" x1="{x:.1f}" y1="{top_y - 14:.1f}" x2="{top_x:.1f}" y2="{spine_y}" '
            f'stroke="{load_color(share)}" stroke-width="{width:.1f}" data-group="{g}" data-load="{share:.3f}">'
            f"<title>{text}</title></line>"
        )
    bar_parts: list[str] = []
    base = [Y_BAR_BOTTOM] * len(groups)
    jobs = client["jobs"]
    for g, j, count in zip(
        client["bars"]["group"], client["bars"]["job"], client["bars"]["gpus"], strict=True
    ):
        x0, x1 = x_of(client["group_x0"][g]), x_of(client["group_x1"][g])
        w = max(1.0, (x1 - x0) * 0.8)
        h = band * count / tallest
        y = base[g] - h
        base[g] = y
        if j >= 0:
            color, hatch = jobs[j]["color"], jobs[j]["hatch"]
            label = f"{escape(jobs[j]['label'])}: {count} GPUs here"
        else:
            color, hatch = SEGMENT_COLORS[j], "x" if j == -3 else ""
            label = {-1: "free on partly busy nodes", -2: "free on wholly free nodes", -3: "not schedulable"}[
                j
            ]
            label = f"{label}: {count} GPUs"
        rect = f'x="{(x0 + x1) / 2 - w / 2:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}"'
        bar_parts.append(
            f'<rect class="ov-bar" {rect} fill="{color}" data-job="{j}"><title>{escape(groups[g])} · {label}</title></rect>'
        )
        if hatch in HATCH_PATHS:
            bar_parts.append(f'<rect {rect} fill="url(#ov-hatch-{_hatch_id(hatch)})" pointer-events="none"/>')
    # Each group's uplink share over its bar, where it fits: a label that would touch the last one
    # drawn is left out (its bundle's tooltip still says it), so 64 groups never run together.
    drawn_to = float("-inf")
    for g, up in enumerate(ups):
        if up["count"]:
            x = x_of((client["group_x0"][g] + client["group_x1"][g]) / 2)
            share = up["load"] / up["cap"] if up["cap"] else 0.0
            text = f"{share:.0%}"
            half = LABEL_CHAR_W * len(text) / 2
            if x - half < drawn_to + LABEL_GAP:
                continue
            drawn_to = x + half
            bar_parts.append(
                f'<text class="ov-load" x="{x:.1f}" y="{base[g] - 3:.1f}" text-anchor="middle">{text}</text>'
            )
    label = (
        f"Overview of {client['cluster']}: {len(spines)} spines, {len(groups)} leaf groups; "
        "bars are GPUs per leaf group by job, bundles are each group's uplinks by predicted load"
    )
    return (
        f'<svg id="overview-svg" class="overview-svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(core_parts + bundle_parts + spine_parts + bar_parts)
        + "</svg>"
    )


def hatch_defs() -> str:
    """An SVG of no size holding every hatch pattern, referenced by the overview and the legend."""
    patterns = "".join(
        f'<pattern id="ov-hatch-{_hatch_id(h)}" width="6" height="6" patternUnits="userSpaceOnUse">'
        f'<path d="{path}" stroke="#222" stroke-width="1"/></pattern>'
        for h, path in HATCH_PATHS.items()
    )
    return f'<svg class="hatch-defs" width="0" height="0" aria-hidden="true"><defs>{patterns}</defs></svg>'


def _hatch_id(hatch: str) -> str:
    return {"/": "fwd", "\\": "back", "x": "cross", "-": "hline", "|": "vline", "+": "plus", ".": "dot"}[
        hatch
    ]


def legend_rows(client: dict, limit: int = 24) -> tuple[list[dict], int]:
    """The legend's first rows: the jobs with most GPUs first (colour, hatch, label, GPUs), and
    how many more there are."""
    order = sorted(range(len(client["jobs"])), key=lambda j: (-len(client["jobs"][j]["gids"]), j))
    rows = [
        {
            "index": j,
            "color": client["jobs"][j]["color"],
            "hatch": client["jobs"][j]["hatch"],
            "hatch_id": _hatch_id(client["jobs"][j]["hatch"])
            if client["jobs"][j]["hatch"] in HATCH_PATHS
            else "",
            "label": client["jobs"][j]["label"],
            "gpus": len(client["jobs"][j]["gids"]),
        }
        for j in order[:limit]
    ]
    return rows, max(0, len(order) - limit)

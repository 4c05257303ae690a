"""Charts of a policy comparison (Plotly) and the HTML report the CLI writes.

Built from the JSON of `Comparison.as_dict(series=True)`, so the CLI's report and the dashboard's
simulation page draw the same figures from the same data.
"""

from __future__ import annotations

import html
import os

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

POLICY_COLOURS = {
    "topo": "#1f77b4",
    "tree_best_fit": "#ff7f0e",
    "first_fit": "#2ca02c",
    "naive": "#d62728",
    "random": "#9467bd",
}


def figures(result: dict) -> dict[str, go.Figure]:
    """The report's figures by name: JCT CDFs, utilisation and fragmentation over time."""
    jct = go.Figure()
    util = go.Figure()
    frag = go.Figure()
    for policy, s in result.get("series", {}).items():
        colour = POLICY_COLOURS.get(policy)
        line = {"color": colour} if colour else {}
        cdf = s["jct_cdf"]
        jct.add_trace(go.Scatter(x=[x / 3600 for x in cdf["jct_s"]], y=cdf["share"], name=policy, line=line))
        hours = [t / 3600 for t in s["times_s"]]
        util.add_trace(go.Scatter(x=hours, y=s["utilisation"], name=policy, line={**line, "shape": "hv"}))
        frag.add_trace(go.Scatter(x=hours, y=s["fragmentation"], name=policy, line={**line, "shape": "hv"}))
    jct.update_layout(
        title="Job completion time, CDF",
        xaxis={"title": "JCT (h)", "type": "log"},
        yaxis={"title": "share of jobs"},
    )
    util.update_layout(
        title="Utilisation", xaxis={"title": "time (h)"}, yaxis={"title": "busy GPUs", "tickformat": ".0%"}
    )
    frag.update_layout(
        title="Fragmentation: free GPUs that cannot host an 8-GPU job in one NVLink domain",
        xaxis={"title": "time (h)"},
        yaxis={"title": "share of free GPUs", "tickformat": ".0%"},
    )
    return {"jct_cdf": jct, "utilisation": util, "fragmentation": frag}


_COLUMNS = (
    ("jobs", "jobs", None),
    ("mean JCT (h)", "jct_s", "mean"),
    ("median JCT (h)", "jct_s", "median"),
    ("p95 JCT (h)", "jct_s", "p95"),
    ("mean queueing (h)", "queueing_s", "mean"),
    ("makespan (h)", "makespan_s", None),
    ("comm GPU-hours", "comm_gpu_hours", None),
    ("effective MFU", "effective_mfu", None),
    ("utilisation", "utilisation", None),
    ("utilisation (arrival window)", "utilisation_window", None),
    ("busy while jobs wait", "busy_while_waiting", None),
    ("fragmentation", "fragmentation", None),
)
_SHARES = ("effective_mfu", "utilisation", "utilisation_window", "busy_while_waiting", "fragmentation")


def metric_rows(result: dict) -> list[tuple[str, list[str]]]:
    """(policy, formatted cells in `_COLUMNS` order) for each policy of a result."""
    rows = []
    for policy, s in result.get("policies", {}).items():
        cells = []
        for _, key, sub in _COLUMNS:
            # Results stored before a metric existed lack it: shown as none.
            v = (s.get(key) or {}).get(sub) if sub else s.get(key)
            if v is None:
                cells.append("–")
            elif key.endswith("_s"):
                cells.append(f"{v / 3600:.2f}")
            elif key in _SHARES:
                cells.append(f"{v:.1%}")
            elif key == "jobs":
                cells.append(str(v))
            else:
                cells.append(f"{v:,.1f}")
        rows.append((policy, cells))
    return rows


def column_names() -> list[str]:
    """The metric table's column headings."""
    return [name for name, _, _ in _COLUMNS]


def write_report(result: dict, folder: str) -> str:
    """Write `index.html` (and plotly.min.js beside it, no CDN) into `folder`; returns its path."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "plotly.min.js"), "w", encoding="utf-8") as fh:
        fh.write(get_plotlyjs())
    parts = [fig.to_html(full_html=False, include_plotlyjs=False) for fig in figures(result).values()]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["policy", *column_names()])
    body = "".join(
        "<tr><td>" + html.escape(p) + "</td>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
        for p, cells in metric_rows(result)
    )
    trace = result.get("trace", {})
    title = f"Policy comparison: {trace.get('jobs', 0)} jobs ({trace.get('format', '?')}) on {result.get('topology', '?')}"
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>"
        "<script src='plotly.min.js'></script></head><body>"
        f"<h1>{html.escape(title)}</h1><table><tr>{head}</tr>{body}</table>"
        + "".join(parts)
        + "</body></html>"
    )
    path = os.path.join(folder, "index.html")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path

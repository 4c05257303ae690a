"""Plotly JSON building blocks for the cluster graph: colours and line/marker traces.

Every trace carries `meta.role`, which the client script uses to decide what each overlay and
zoom level shows. Coordinates are rounded to 3 decimals to keep the page small.
"""

from __future__ import annotations

import numpy as np
from plotly.colors import qualitative

FREE_COLOR = "#c4c8cc"
LINK_COLOR = "#9aa4ad"
WIRE_COLOR = "#b8c0c8"
DOMAIN_COLOR = "#2e7d32"
HIGHLIGHT_COLOR = "#111111"
SWITCH_COLORS = {"core": "#37474f", "spine": "#455a64", "leaf": "#607d8b"}
# Job colours safe for colour-blind eyes: Okabe-Ito (without black, kept for highlights) and the
# dark members of Paul Tol's muted scheme. Past these, a job's style adds a mark inside its GPU
# squares (and a hatch in the zoomed-out bars): colour x mark gives JOB_STYLES distinct looks.
JOB_PALETTE = (
    "#E69F00",
    "#56B4E9",
    "#009E73",
    "#F0E442",
    "#0072B2",
    "#D55E00",
    "#CC79A7",
    "#332288",
    "#117733",
    "#882255",
    "#999933",
    "#AA4499",
)
# (GPU marker symbol, bar hatch) per mark; the plain square first.
JOB_MARKS = (("square", ""), ("square-x", "x"), ("square-cross", "+"), ("diamond-wide", "/"))
JOB_STYLES = len(JOB_PALETTE) * len(JOB_MARKS)
RAIL_PALETTE = tuple(qualitative.Set2 + qualitative.Pastel1)


def job_style(style: int) -> tuple[str, str, str]:
    """(colour, GPU marker symbol, bar hatch) of style number `style` (0..JOB_STYLES-1)."""
    style %= JOB_STYLES
    symbol, hatch = JOB_MARKS[style // len(JOB_PALETTE)]
    return JOB_PALETTE[style % len(JOB_PALETTE)], symbol, hatch


def rounded(values) -> list:
    """Numbers as a JSON-ready list rounded to 3 decimals."""
    return np.round(np.asarray(values, dtype=float), 3).tolist()


def segments(x0, y0, x1, y1) -> tuple[list, list]:
    """x and y arrays of line segments separated by gaps (None) for one lines trace."""
    n = len(x0)
    xs: list = [None] * (3 * n)
    ys: list = [None] * (3 * n)
    xs[0::3], xs[1::3] = rounded(x0), rounded(x1)
    ys[0::3], ys[1::3] = rounded(y0), rounded(y1)
    return xs, ys


def boxes(x0, x1, y0, y1) -> tuple[list, list]:
    """x and y arrays of closed rectangles separated by gaps, for one lines trace."""
    xs: list = []
    ys: list = []
    for a, b, c, d in zip(rounded(x0), rounded(x1), rounded(y0), rounded(y1), strict=True):
        xs += [a, b, b, a, a, None]
        ys += [c, c, d, d, c, None]
    return xs, ys


def lines(name: str, xs: list, ys: list, color: str, width: float, role: str, *, legend=False) -> dict:
    """A lines trace without hover (cables and boxes), `width` in px."""
    return {
        "type": "scatter",
        "mode": "lines",
        "name": name,
        "x": xs,
        "y": ys,
        "line": {"color": color, "width": width},
        "hoverinfo": "skip",
        "showlegend": legend,
        "meta": {"role": role},
    }


def markers(name: str, x, y, text, role: str, *, marker: dict, legend=False, **extra) -> dict:
    """A markers trace whose hover shows `text` (None: no hover); `marker` is Plotly's marker."""
    trace = {
        "type": "scatter",
        "mode": "markers",
        "name": name,
        "x": rounded(x),
        "y": rounded(y),
        "marker": marker,
        "showlegend": legend,
        "meta": {"role": role},
    }
    if text is None:
        trace["hoverinfo"] = "skip"
    else:
        trace["text"] = text
        trace["hovertemplate"] = "%{text}<extra></extra>"
    trace.update(extra)
    return trace

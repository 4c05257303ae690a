"""Plotly charts of the job page: MFU and comm share over time, predicted step time by policy.

Builders over plain data that return Plotly JSON (`data` and `layout`). The time charts show the
measured series beside the prediction; with no measured samples, the predicted value as a flat
dashed line over the job's run so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from apps.dashboard.whatif import WhatIfRow

PREDICTED_COLOR = "#1f77b4"
MEASURED_COLOR = "#d62728"
UTIL_COLOR = "#2e7d32"


def _base_layout(title: str, y_title: str, *, percent: bool) -> dict:
    yaxis = {"title": {"text": y_title}, "rangemode": "tozero", "zeroline": False}
    if percent:
        yaxis.update(tickformat=".0%", range=[0, 1])
    return {
        "title": {"text": title, "font": {"size": 14}},
        "height": 260,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
        "xaxis": {"type": "date"},
        "yaxis": yaxis,
        "legend": {"orientation": "h", "y": -0.25},
        "plot_bgcolor": "#ffffff",
    }


def timeline_figure(
    *,
    title: str,
    y_title: str,
    predicted: float | None,
    since: datetime | None,
    until: datetime,
    samples: Sequence[tuple[datetime, float]] = (),
    percent: bool = True,
    predicted_samples: Sequence[tuple[datetime, float]] = (),
    extra: Sequence[tuple[str, Sequence[tuple[datetime, float]], str]] = (),
) -> dict:
    """A quantity over time: measured `samples` (time, value) as a line and the predicted value
    as a dashed line: stepping through `predicted_samples` (the prediction at each measurement,
    which re-pricing moves) then `predicted` until `until`, or flat from `since` without them.
    `extra` adds (name, samples, colour) measured lines. Values are fractions when `percent`."""
    data = []
    if predicted is not None and (since is not None or predicted_samples):
        points = list(predicted_samples) or [(since, predicted)]
        points.append((until, predicted))
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "predicted",
                "x": [t.isoformat() for t, _ in points],
                "y": [v for _, v in points],
                "line": {"color": PREDICTED_COLOR, "dash": "dash", "width": 2, "shape": "hv"},
                "hovertemplate": "predicted %{y:.1%}<extra></extra>" if percent else None,
            }
        )
    for name, points, color in (("measured", samples, MEASURED_COLOR), *extra):
        if not points:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": name,
                "x": [t.isoformat() for t, _ in points],
                "y": [v for _, v in points],
                "line": {"color": color, "width": 2},
            }
        )
    layout = _base_layout(title, y_title, percent=percent)
    if not samples:
        layout["annotations"] = [
            {
                "text": "no measurements yet: predicted values",
                "xref": "paper",
                "yref": "paper",
                "x": 1,
                "y": 1.12,
                "xanchor": "right",
                "showarrow": False,
                "font": {"size": 11, "color": "#607d8b"},
            }
        ]
    for trace in data:
        if trace.get("hovertemplate") is None:
            trace.pop("hovertemplate", None)
    return {"data": data, "layout": layout}


def whatif_figure(rows: Sequence[WhatIfRow]) -> dict:
    """Predicted step time (ms) of every policy that fits, split into compute and exposed
    communication, the job's current placement marked."""
    fits = [r for r in rows if r.fits and r.step_ms is not None]
    names = [r.policy + (" (current)" if r.is_current else "") for r in fits]
    comm_exposed = [max(0.0, (r.step_ms or 0.0) - _compute(r)) for r in fits]
    data = [
        {
            "type": "bar",
            "name": "compute",
            "orientation": "h",
            "y": names,
            "x": [_compute(r) for r in fits],
            "marker": {"color": "#90a4ae"},
            "hovertemplate": "%{y}: compute %{x:.3g} ms<extra></extra>",
        },
        {
            "type": "bar",
            "name": "exposed communication",
            "orientation": "h",
            "y": names,
            "x": comm_exposed,
            "marker": {"color": "#ef6c00"},
            "hovertemplate": "%{y}: communication %{x:.3g} ms<extra></extra>",
        },
    ]
    layout = {
        "barmode": "stack",
        "height": 60 + 36 * max(len(fits), 1),
        "margin": {"l": 150, "r": 20, "t": 10, "b": 40},
        "xaxis": {"title": {"text": "predicted step time (ms)"}, "rangemode": "tozero"},
        "yaxis": {"autorange": "reversed"},
        "legend": {"orientation": "h", "y": -0.4},
        "plot_bgcolor": "#ffffff",
    }
    return {"data": data, "layout": layout}


def _compute(row: WhatIfRow) -> float:
    return row.compute_ms if row.compute_ms is not None else 0.0

"""Template helpers of the dashboard: unit-aware number formats, compact rank lists, the picker,
what each status means."""

from __future__ import annotations

import math

from django import template
from django.utils.html import format_html

from apps.scheduling.choices import STATUS_HELP
from apps.topology.models import Cluster

register = template.Library()


def _number(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


@register.filter
def ms(value) -> str:
    """A time in milliseconds: "12.3 ms", "1.24 s" past 10 s, "–" when missing."""
    x = _number(value)
    if x is None:
        return "–"
    if x >= 10_000:
        return f"{x / 1000:.3g} s"
    return f"{x:.3g} ms" if x < 100 else f"{x:.0f} ms"


@register.filter
def pct(value) -> str:
    """A fraction as a percentage: 0.512 -> "51.2%", "–" when missing."""
    x = _number(value)
    return "–" if x is None else f"{100 * x:.1f}%"


@register.filter
def gbps(value) -> str:
    """A bandwidth in GB/s: "450 GB/s", "no path" for zero or infinite."""
    x = _number(value)
    return "no path" if x is None or x <= 0 else f"{x:.4g} GB/s"


@register.filter
def ranks(values) -> str:
    """A rank list with runs collapsed: (0, 1, 2, 3, 8) -> "0-3, 8"."""
    items = [int(v) for v in values]
    out: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ", ".join(out)


@register.inclusion_tag("dashboard/_cluster_picker.html", takes_context=True)
def cluster_picker(context):
    """The top bar's cluster picker: every cluster, the page's (or else the last picked) selected."""
    current = getattr(context.get("cluster"), "name", None)
    request = context.get("request")
    if current is None and request is not None:
        current = request.session.get("dashboard_cluster")
    return {
        "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
        "current": current,
    }


@register.filter
def duration_s(value) -> str:
    """A duration in seconds, coarsely: "45 s", "12 min", "3.5 h", "2.1 d"."""
    x = _number(value)
    if x is None:
        return "–"
    if x < 60:
        return f"{x:.0f} s"
    if x < 3600:
        return f"{x / 60:.0f} min"
    if x < 86400:
        return f"{x / 3600:.1f} h"
    return f"{x / 86400:.1f} d"


@register.filter
def status_help(value, kind: str = "job") -> str:
    """What a status means ("job", "node" or "proposal"), for its tooltip; "" if unknown."""
    return STATUS_HELP.get(kind, {}).get(str(value), "")


@register.inclusion_tag("dashboard/_status_glossary.html")
def status_glossary(kind: str = "job", title: str = "What the statuses mean"):
    """A definition list of every status of `kind` and its meaning, in the status machine's order."""
    return {"kind": kind, "title": title, "items": [(str(k), v) for k, v in STATUS_HELP[kind].items()]}


@register.simple_tag(takes_context=True)
def sort_th(context, key: str, label: str, css: str = "") -> str:
    """A sortable column header: a link that sorts by `key` (ascending first, then toggling),
    keeping the page's other filters; `aria-sort` on the column sorted by."""
    request = context["request"]
    current = request.GET.get("sort", "")
    query = request.GET.copy()
    query.pop("fragment", None)
    query["sort"] = f"-{key}" if current == key else key
    state = {key: "ascending", f"-{key}": "descending"}.get(current)
    arrow = {"ascending": "▲", "descending": "▼"}.get(state, "↕")
    hint = f"sort by {label.lower()}, {'descending' if state == 'ascending' else 'ascending'}"
    return format_html(
        '<th{}{} data-sort="{}"><a class="sort" href="?{}" title="{}">{} <span class="arrow" aria-hidden="true">{}</span></a></th>',
        format_html(' class="{}"', css) if css else "",
        format_html(' aria-sort="{}"', state) if state else "",
        key,
        query.urlencode(),
        hint,
        label,
        arrow,
    )


@register.simple_tag(takes_context=True)
def with_query(context, **changes) -> str:
    """The page's query string with `changes` applied (a None or "" value removes the key), and
    without `fragment`."""
    query = context["request"].GET.copy()
    query.pop("fragment", None)
    for key, value in changes.items():
        query.pop(key, None)
        if value not in (None, ""):
            query[key] = value
    return "?" + query.urlencode()


def relative_text(when, now=None) -> str:
    """A moment relative to now: "5 min ago", "in 24 h", "now" within a second; "–" if none."""
    from datetime import datetime

    from django.utils import timezone

    if not isinstance(when, datetime):
        return "–"
    now = now or timezone.now()
    seconds = (when - now).total_seconds()
    if abs(seconds) < 1:
        return "now"
    span = duration_s(abs(seconds))
    return f"in {span}" if seconds > 0 else f"{span} ago"


@register.filter
def relative(when) -> str:
    """A datetime as "5 min ago" or "in 24 h" (the exact UTC time in a tooltip is the template's)."""
    return relative_text(when)


@register.filter
def words(value) -> str:
    """An identifier for people: "no_agent" -> "no agent"."""
    return str(value).replace("_", " ")


@register.simple_tag
def sparkline(points, width: int = 240, height: int = 36, top: float = 1.0) -> str:
    """An inline SVG line of [(time, value)] points, values from 0 to at least `top` (a dashed
    line marks `top`); empty without two points. No script: the page's CSP allows it."""
    if not points or len(points) < 2:
        return ""
    t0 = points[0][0].timestamp()
    span = max(1.0, points[-1][0].timestamp() - t0)
    high = max(top, max(v for _, v in points)) or 1.0
    xy = " ".join(
        f"{(p[0].timestamp() - t0) / span * width:.1f},{height - min(p[1], high) / high * height:.1f}"
        for p in points
    )
    mark = height - top / high * height
    return format_html(
        '<svg class="spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<line x1="0" x2="{}" y1="{}" y2="{}" class="spark-top"/><polyline points="{}" class="spark-line"/></svg>',
        width,
        height,
        width,
        height,
        f"{len(points)} samples from {points[0][1]:.0%} to {points[-1][1]:.0%}, peak {max(v for _, v in points):.0%}",
        width,
        f"{mark:.1f}",
        f"{mark:.1f}",
        xy,
    )


_ISO_UTC = __import__("re").compile(r"(\bat )?\b(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}):\d{2}Z\b")


@register.filter
def relative_times(text) -> str:
    """Text with its UTC times (`2026-12-04T10:00:00Z`, as pending reasons write them) made
    relative: "start at 2026-12-04T10:00:00Z" -> "start in 5.0 h (12-04 10:00 UTC)"."""
    from datetime import UTC, datetime

    def swap(m) -> str:
        day, hour = m.group(2), m.group(3)
        try:
            when = datetime.strptime(f"{day} {hour}", "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
        except ValueError:
            return m.group(0)
        rel = relative_text(when)
        at = "" if rel.startswith("in ") else (m.group(1) or "")
        return f"{at}{rel} ({day[5:]} {hour} UTC)"

    return _ISO_UTC.sub(swap, str(text or ""))

"""The usage page: GPU-hours used inside a period, jobs, mean wait and mean MFU per user, account or
cluster, as CSV too."""

from __future__ import annotations

import csv as csvlib
from datetime import UTC, datetime, timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from apps.dashboard.usage import USAGE_COLUMNS, usage_by_user
from apps.topology.models import Cluster

RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
MAX_SPAN = timedelta(days=366)
GROUPS = ("user", "account", "qos", "cluster")


def _when(raw: str, field: str, errors: list[str]) -> datetime | None:
    if not raw:
        return None
    for fmt in ("%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(raw[:16], fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    errors.append(f"{field}: a UTC date (YYYY-MM-DD) or date and time (YYYY-MM-DDTHH:MM)")
    return None


def period(query) -> tuple[datetime, datetime, str, list[str]]:
    """(since, until, preset, errors) from `range`, or `since` and `until` (default: the last 7 days)."""
    errors: list[str] = []
    now = timezone.now()
    preset = query.get("range", "")
    if preset and preset not in RANGES:
        errors.append(f"range: one of {', '.join(RANGES)}")
        preset = ""
    since = _when(query.get("since", ""), "since", errors)
    until = _when(query.get("until", ""), "until", errors)
    if since is None and until is None:
        preset = preset or "7d"
        return now - RANGES[preset], now, preset, errors
    until = until or now
    since = since or until - RANGES["7d"]
    if since >= until:
        errors.append("since: before until")
    elif until - since > MAX_SPAN:
        errors.append("since: at most 366 days before until")
    return since, until, "", errors


@login_required
@require_GET
def usage_page(request, csv: bool = False):
    """`/usage/?range=24h|7d|30d` or `?since=&until=` (UTC), `?cluster=NAME`, `?by=user|account`,
    `?by=cluster`, `?format=csv` (or `/usage.csv`): the GPU-seconds used inside the period per user,
    account or cluster (running jobs and jobs that straddle an edge included, for their part
    inside it). Bad parameters answer 400 naming them."""
    since, until, preset, errors = period(request.GET)
    cluster = None
    name = request.GET.get("cluster", "")
    if name:
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            errors.append(f"cluster: no cluster named {name[:60]!r}")
    by = request.GET.get("by", "user")
    if by not in GROUPS:
        errors.append(f"by: one of {', '.join(GROUPS)}")
        by = "user"
    rows = (
        [] if errors else usage_by_user(user=request.user, since=since, until=until, cluster=cluster, by=by)
    )
    if (csv or request.GET.get("format") == "csv") and not errors:
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        stamp = f"{since:%Y%m%dT%H%M}-{until:%Y%m%dT%H%M}"
        response["Content-Disposition"] = f'attachment; filename="topoweb-usage-{stamp}.csv"'
        out = csvlib.writer(response)
        out.writerow([by if c == "user" else c for c in USAGE_COLUMNS] + ["since", "until", "cluster"])
        for r in rows:
            values = [r[c] for c in USAGE_COLUMNS]
            values = [round(v, 4) if isinstance(v, float) else ("" if v is None else v) for v in values]
            out.writerow([*values, since.isoformat(), until.isoformat(), name])
        return response
    total = {"gpu_hours": sum(r["gpu_hours"] for r in rows)}
    context = {
        "rows": rows,
        "total": total,
        "since": since,
        "until": until,
        "preset": preset,
        "ranges": list(RANGES),
        "errors": errors,
        "cluster_name": name,
        "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
        "csv_query": request.GET.urlencode(),
        "by": by,
    }
    return render(request, "dashboard/usage.html", context, status=400 if errors else 200)

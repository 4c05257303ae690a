"""The queue page: waiting and running jobs with filters, refreshed in place by a small script."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from apps.dashboard.forms import HISTORY_PRESETS, QueueFilterForm
from apps.dashboard.selectors import can_see_details, job_label, job_nodes, queue_jobs
from apps.dashboard.usage import job_accounting
from apps.placement.bounds import lower_bound
from apps.placement.jobs import load_job
from apps.scheduling.accounts import accounts_use
from apps.scheduling.choices import WAITING_STATUSES
from apps.topology.services import cluster_topology

from .common import refresh_s

QUEUE_LIMIT = 500
REFRESH_S = 10
NODES_LISTED = 4


def queue_rows(user, jobs) -> list[dict]:
    """Table rows for the queue: other users' jobs keep only id, cluster, status, GPUs, age and
    the scheduler's pending reason (a finished job's reason may name who cancelled it or carry a
    launcher's message, so it shows only to those who see the job's details); only the jobs whose
    details `user` sees list their nodes. A waiting job has no placement yet: its step time and
    MFU are the lower bound (the best any placement could do on the empty cluster)."""
    now = timezone.now()
    topologies: dict[int, object] = {}
    jobs = list(jobs)
    nodes = job_nodes(job_ids=[j.pk for j in jobs if can_see_details(user, j)])
    rows = []
    for job in jobs:
        details = can_see_details(user, job)
        on = nodes.get(job.pk, []) if details else []
        bound = None
        if details and job.status in WAITING_STATUSES:
            if job.cluster_id not in topologies:
                topologies[job.cluster_id] = cluster_topology(cluster=job.cluster)
            bound = lower_bound(topologies[job.cluster_id], load_job(job.spec))
        rows.append(
            {
                "job": job,
                "details": details,
                "label": job_label(user, job),
                "reason": job.pending_reason if details or job.status in WAITING_STATUSES else "",
                "owner": job.owner.get_username() if details else "other user",
                "policy": (job.placed_policy or job.policy or job.cluster.policy) if details else "",
                "step_ms": job.predicted_step_ms if details else None,
                "mfu": job.predicted_mfu if details else None,
                "bound": bound,
                "age_s": (now - job.submitted_at).total_seconds(),
                "nodes": on[:NODES_LISTED],
                "more_nodes": max(0, len(on) - NODES_LISTED),
            }
        )
    return rows


@login_required
@require_GET
def queue_page(request):
    """`/queue/`: filters status, owner and cluster; `?sort=COLUMN` or `-COLUMN` (a fixed set);
    finished jobs in a time range by `?range=1h|24h|7d` or `?since=`/`?until=` (ISO date and
    time, UTC, at most a year apart); `?fragment=1` returns the table alone and `?refresh=S` sets
    the auto-refresh period (2..300 s, default 10). Bad filters answer 400 naming the field."""
    form = QueueFilterForm(_filters(request.GET), user=request.user)
    filters = form.cleaned_data if form.is_valid() else {}
    between = form.finished_between()
    jobs = queue_jobs(
        user=request.user,
        statuses=form.statuses(),
        owner=filters.get("owner", ""),
        cluster=filters.get("cluster"),
        finished_between=between,
        order=form.order(),
    )
    if form.is_bound and not form.is_valid():
        jobs = jobs.none()  # the errors are shown; no unfiltered list in their place
    total = jobs.count()
    rows = queue_rows(request.user, jobs[:QUEUE_LIMIT])
    if between is not None:
        # The history: what sacct gives per finished job (wait, runtime, exit code, GPU-hours).
        acct = job_accounting(r["job"] for r in rows)
        for r in rows:
            r["acct"] = acct[r["job"].pk]
    context = {
        "form": form,
        "rows": rows,
        "total": total,
        "limit": QUEUE_LIMIT,
        "cluster": filters.get("cluster"),
        "refresh_s": refresh_s(request.GET.get("refresh"), REFRESH_S),
        "history": between is not None,
        "sort": filters.get("sort", ""),
        "presets": list(HISTORY_PRESETS),
        "preset": filters.get("range", ""),
    }
    status = 400 if form.is_bound and not form.is_valid() else 200
    if request.GET.get("fragment"):
        return render(request, "dashboard/_queue_table.html", context, status=status)
    chosen = filters.get("cluster")
    context["accounts"] = accounts_use(clusters=[chosen] if chosen else None)
    return render(request, "dashboard/queue.html", context, status=status)


def _filters(query):
    # The form's own fields only: `fragment` and `refresh` are not filters, and a query of
    # nothing else leaves the form unbound (the defaults apply).
    data = query.copy()
    for key in ("fragment", "refresh"):
        data.pop(key, None)
    return data or None

"""The queue page: waiting and running jobs with filters, refreshed in place by a small script."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from apps.dashboard.forms import QueueFilterForm
from apps.dashboard.selectors import can_see_details, job_label, queue_jobs
from apps.placement.bounds import lower_bound
from apps.placement.jobs import load_job
from apps.scheduling.choices import WAITING_STATUSES
from apps.topology.services import cluster_topology

QUEUE_LIMIT = 500
REFRESH_S = 10


def queue_rows(user, jobs) -> list[dict]:
    """Table rows for the queue: other users' jobs keep only id, cluster, status, GPUs, age and
    the scheduler's pending reason (a finished job's reason may name who cancelled it or carry a
    launcher's message, so it shows only to those who see the job's details). A waiting job has no placement yet: its step time and MFU are the lower
    bound (the best any placement could do on the empty cluster)."""
    now = timezone.now()
    topologies: dict[int, object] = {}
    rows = []
    for job in jobs:
        details = can_see_details(user, job)
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
            }
        )
    return rows


@login_required
@require_GET
def queue_page(request):
    """`/queue/`: filters status, owner and cluster; `?fragment=1` returns the table alone and
    `?refresh=S` sets the auto-refresh period (2..300 s, default 10)."""
    form = QueueFilterForm(request.GET or None, user=request.user)
    filters = form.cleaned_data if form.is_valid() else {}
    jobs = queue_jobs(
        user=request.user,
        statuses=form.statuses(),
        owner=filters.get("owner", ""),
        cluster=filters.get("cluster"),
    )
    if form.is_bound and not form.is_valid():
        jobs = jobs.none()  # the errors are shown; no unfiltered list in their place
    total = jobs.count()
    context = {
        "form": form,
        "rows": queue_rows(request.user, jobs[:QUEUE_LIMIT]),
        "total": total,
        "limit": QUEUE_LIMIT,
        "cluster": filters.get("cluster"),
        "refresh_s": _refresh_s(request.GET.get("refresh")),
    }
    if request.GET.get("fragment"):
        return render(request, "dashboard/_queue_table.html", context)
    return render(request, "dashboard/queue.html", context)


def _refresh_s(value: str | None) -> int:
    try:
        return min(300, max(2, int(value))) if value else REFRESH_S
    except ValueError:
        return REFRESH_S

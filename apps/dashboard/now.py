"""What is broken right now, across clusters: the operators' landing page (`/now/`).

Each part is a short read: nodes not up (with reason and since when), unhealthy GPUs, jobs
failed in the last hour with the first rank that failed and the end of its output, open
hotspots and migration proposals, node agents and metrics collection running behind, and the
queue's pressure per cluster (waiting jobs and GPUs against free GPUs).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from django.db.models import Case, Count, Min, Q, Sum, Value, When
from django.urls import reverse
from django.utils import timezone

from apps.dashboard.selectors import can_see_details, job_label, stopping_ranks
from apps.executors.agents.services import down_after_s
from apps.metrics import selectors as metrics
from apps.metrics.choices import ScrapeState, SourceKind
from apps.metrics.models import MetricsSource, NodeScrape
from apps.scheduling.choices import (
    ACTIVE_STATUSES,
    INFRA_EXIT_CAUSES,
    WAITING_STATUSES,
    JobStatus,
    NodeState,
    ProposalStatus,
    RankState,
)
from apps.scheduling.models import Job, MigrationProposal, NodeHealth, RankRun
from apps.scheduling.snapshot import cluster_snapshot
from apps.topology.models import Cluster

FAILED_WINDOW_S = 3600
# An agent writes its heartbeat at least every half of down_after_s (see agent_heartbeat): past
# three quarters it is late, at down_after_s it is down.
AGENT_LATE_FRACTION = 0.75
TAIL_LINES = 6
LISTED = 50  # rows per part; the linked pages list the rest


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def broken_nodes() -> list[dict]:
    """Nodes down, drained or draining, worst first (down, then drained, then draining), and
    within a state the longest in it first."""
    order = {NodeState.DOWN: 0, NodeState.DRAINED: 1, NodeState.DRAINING: 2}
    rows = (
        NodeHealth.objects.exclude(state=NodeState.UP)
        .select_related("node__cluster")
        .only("state", "reason", "state_since", "last_seen", "node__name", "node__cluster__name")
    )
    out = [
        {
            "cluster": a.node.cluster.name,
            "node": a.node.name,
            "state": a.state,
            "reason": a.reason,
            "since": a.state_since,
            "last_seen": a.last_seen,
        }
        for a in rows
    ]
    far = timezone.now() + timedelta(days=1)
    out.sort(key=lambda r: (order.get(r["state"], 3), r["since"] or far, r["cluster"], r["node"]))
    return out


def unhealthy_gpus() -> list[dict]:
    """GPUs the agents reported unhealthy (XID errors, missing from nvidia-smi), by node."""
    rows = (
        NodeHealth.objects.exclude(unhealthy_gpus=[])
        .select_related("node__cluster")
        .order_by("node__cluster__name", "node__position", "node_id")
    )
    return [
        {
            "cluster": a.node.cluster.name,
            "node": a.node.name,
            "gpu": g.get("gpu"),
            "reason": g.get("reason", ""),
        }
        for a in rows
        for g in a.unhealthy_gpus or ()
        if isinstance(g, dict)
    ]


def failed_jobs(*, user, window_s: float = FAILED_WINDOW_S) -> list[dict]:
    """Jobs failed in the last `window_s` seconds, last first, each with the first rank that
    exited non-zero of its own doing (rank, node, exit code, the end of its output; a rank TopoWeb
    stopped or a fault ended only when no other) where `user` may see it."""
    since = timezone.now() - timedelta(seconds=window_s)
    jobs = list(
        Job.objects.filter(status=JobStatus.FAILED, finished_at__gte=since)
        .select_related("owner", "cluster")
        .defer("predicted", "flows")
        .order_by("-finished_at", "-id")[:LISTED]
    )
    first_fail: dict[int, RankRun] = {}
    # The rank whose own doing failed the job first, before the ranks TopoWeb stopped after it (exit
    # -15, cause "stopped"), whatever order their reports came in.
    runs = (
        RankRun.objects.filter(job_id__in=[j.pk for j in jobs], state=RankState.EXITED)
        .exclude(exit_code=0)
        .annotate(infra=Case(When(exit_cause__in=INFRA_EXIT_CAUSES, then=Value(1)), default=Value(0)))
        .select_related("node")
        .order_by("job_id", "-generation", "infra", "exited_at", "rank")
    )
    for run in runs:
        first_fail.setdefault(run.job_id, run)
    out = []
    for job in jobs:
        details = can_see_details(user, job)
        run = first_fail.get(job.pk)
        out.append(
            {
                "job": job,
                "label": job_label(user, job),
                "url": reverse("dashboard:job", args=[job.pk]) if details else None,
                "cluster": job.cluster.name,
                "reason": job.pending_reason if details else "",
                "rank": run.rank if run else None,
                "node": run.node.name if run else "",
                "exit_code": run.exit_code if run else None,
                "tail": _tail(run.log_tail) if run and details else "",
            }
        )
    return out


def open_proposals(*, user) -> list[dict]:
    """Migration proposals waiting for a decision, largest predicted gain first."""
    rows = (
        MigrationProposal.objects.filter(status=ProposalStatus.PROPOSED)
        .select_related("job__owner", "job__cluster")
        .order_by("-predicted_gain", "-id")[:LISTED]
    )
    return [
        {
            "proposal": p,
            "label": job_label(user, p.job),
            "url": reverse("dashboard:job", args=[p.job_id]) if can_see_details(user, p.job) else None,
            "cluster": p.job.cluster.name,
        }
        for p in rows
    ]


def agents_behind() -> list[dict]:
    """Agents not yet down whose last heartbeat is older than AGENT_LATE_FRACTION of the down
    threshold, the latest first, with how long ago it was."""
    now = timezone.now()
    late = now - timedelta(seconds=AGENT_LATE_FRACTION * down_after_s())
    rows = (
        NodeHealth.objects.exclude(state=NodeState.DOWN)
        .filter(last_seen__lt=late)
        .select_related("node__cluster")
        .order_by("last_seen")[:LISTED]
    )
    return [
        {
            "cluster": a.node.cluster.name,
            "node": a.node.name,
            "last_seen": a.last_seen,
            "age_s": (now - a.last_seen).total_seconds(),
            "down_in_s": max(0.0, down_after_s() - (now - a.last_seen).total_seconds()),
        }
        for a in rows
    ]


def metrics_behind() -> list[dict]:
    """Per cluster, the nodes whose metrics collection failed or went stale: how many, the
    oldest last success and the latest error. A node without an exporter (no `dcgm_url` on a
    cluster read from each node's dcgm-exporter) is not measured, not failing: no alarm."""
    out = []
    prometheus = set(
        MetricsSource.objects.filter(kind=SourceKind.PROMETHEUS).values_list("cluster_id", flat=True)
    )
    for cluster in Cluster.objects.order_by("name"):
        fresh_s = metrics.freshness_s(cluster=cluster)
        cutoff = timezone.now() - timedelta(seconds=fresh_s)
        bad = NodeScrape.objects.filter(node__cluster=cluster).filter(
            ~Q(state=ScrapeState.OK) | Q(last_success_at__lt=cutoff) | Q(last_success_at__isnull=True)
        )
        if cluster.pk not in prometheus:
            bad = bad.exclude(node__dcgm_url="")
        agg = bad.aggregate(n=Count("id"), oldest=Min("last_success_at"))
        if not agg["n"]:
            continue
        last = bad.exclude(last_error="").order_by("-last_error_at").select_related("node").first()
        out.append(
            {
                "cluster": cluster.name,
                "nodes": agg["n"],
                "oldest_success": agg["oldest"],
                "error": last.last_error[:200] if last else "",
                "error_node": last.node.name if last else "",
                "fresh_s": fresh_s,
            }
        )
    return out


def queue_pressure() -> list[dict]:
    """Per cluster: jobs and GPUs waiting, the oldest wait, GPUs free now and held by placed
    jobs, and the pressure (GPUs waiting per free GPU; None when nothing waits)."""
    now = timezone.now()
    out = []
    for cluster in Cluster.objects.order_by("name"):
        waiting = Job.objects.filter(cluster=cluster, status__in=WAITING_STATUSES).aggregate(
            jobs=Count("id"), gpus=Sum("gpus"), oldest=Min("submitted_at")
        )
        placed = Job.objects.filter(cluster=cluster, status__in=ACTIVE_STATUSES).aggregate(
            jobs=Count("id"), gpus=Sum("gpus")
        )
        snap = cluster_snapshot(cluster=cluster)
        free = int(np.count_nonzero(snap.free))
        gpus_waiting = int(waiting["gpus"] or 0)
        out.append(
            {
                "cluster": cluster.name,
                "gpus": int(snap.topology.n_gpus),
                "free": free,
                "waiting_jobs": waiting["jobs"],
                "waiting_gpus": gpus_waiting,
                "oldest_wait_s": (now - waiting["oldest"]).total_seconds() if waiting["oldest"] else None,
                "placed_jobs": placed["jobs"],
                "placed_gpus": int(placed["gpus"] or 0),
                "pressure": (gpus_waiting / max(1, free)) if gpus_waiting else None,
            }
        )
    return out


def hotspot_rows(*, user) -> list[dict]:
    """Open hotspots, newest first, their job named as `user` may see it."""
    out = []
    for h in metrics.open_hotspots()[:LISTED]:
        details = h.job is not None and can_see_details(user, h.job)
        out.append(
            {
                "hotspot": h,
                "cluster": h.cluster.name,
                "label": job_label(user, h.job) if h.job is not None else f"leaf {h.leaf}",
                "url": reverse("dashboard:job", args=[h.job_id]) if details else None,
            }
        )
    return out


def now_overview(*, user) -> dict:
    """Everything the now page shows, and how many problems in all (0: nothing broken)."""
    parts = {
        "nodes": broken_nodes(),
        "unhealthy": unhealthy_gpus(),
        "failed": failed_jobs(user=user),
        "hotspots": hotspot_rows(user=user),
        "proposals": open_proposals(user=user),
        "agents": agents_behind(),
        "stopping": stopping_ranks(user=user),
        "metrics": metrics_behind(),
        "queues": queue_pressure(),
    }
    problems = sum(len(parts[k]) for k in ("nodes", "unhealthy", "failed", "hotspots", "agents", "metrics"))
    return {**parts, "problems": problems, "at": timezone.now(), "failed_window_s": FAILED_WINDOW_S}

"""Reads behind the dashboard pages: visibility rules, the cluster graph's data, the queue.

Visibility follows the API: staff see every job; a user sees the details of their own jobs, and
other users' jobs only as "job N (other user)" with status, GPU count, age and pending reason.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count, Max, QuerySet, Sum
from django.urls import reverse

from apps.api import roles
from apps.dashboard.jobview import JobView, job_view
from apps.dashboard.layout import ClusterLayout, cluster_layout
from apps.placement.jobs import load_job
from apps.placement.topology import Topology
from apps.scheduling.choices import ACTIVE_STATUSES, WAITING_STATUSES
from apps.scheduling.models import Allocation, Job, MigrationProposal
from apps.scheduling.snapshot import ClusterSnapshot, cluster_snapshot
from apps.topology.models import Cluster

_LAYOUTS: weakref.WeakKeyDictionary[Topology, ClusterLayout] = weakref.WeakKeyDictionary()
_LAYOUT_LOCK = threading.Lock()


def layout_for(topology: Topology) -> ClusterLayout:
    """The drawing layout of a topology snapshot, computed once per snapshot object."""
    with _LAYOUT_LOCK:
        hit = _LAYOUTS.get(topology)
    if hit is None:
        hit = cluster_layout(topology)
        with _LAYOUT_LOCK:
            _LAYOUTS[topology] = hit
    return hit


def can_see_details(user, job: Job) -> bool:
    """True if `user` may see the job's name, owner, spec, ranks and predictions."""
    return bool(job.owner_id == user.pk or roles.sees_all_jobs(user))


def job_label(user, job: Job) -> str:
    """How the job is named to `user`: "job 7 · bert (alice)", or "job 7 (other user)"."""
    if can_see_details(user, job):
        return f"job {job.pk} · {job.name} ({job.owner.get_username()})"
    return f"job {job.pk} (other user)"


def visible_jobs(user) -> QuerySet[Job]:
    """The jobs whose page `user` may open: all with scheduling.view_job, their own otherwise."""
    jobs = Job.objects.select_related("cluster", "owner")
    return jobs if roles.sees_all_jobs(user) else jobs.filter(owner=user)


@dataclass(frozen=True)
class ClusterGraphData:
    """What the cluster page draws: the snapshot, its layout and one view per active job."""

    cluster: Cluster
    snapshot: ClusterSnapshot
    layout: ClusterLayout
    jobs: list[JobView]
    queued: int


def cluster_graph_data(*, cluster: Cluster, user) -> ClusterGraphData:
    """The snapshot of `cluster` with every placed job as `user` may see it."""
    snap = cluster_snapshot(cluster=cluster)
    topo = snap.topology
    gids_of = {a.job_id: a.gids for a in snap.active}
    flows_of = {a.job_id: a.flows for a in snap.active}
    rows = (
        Job.objects.filter(pk__in=list(gids_of), status__in=ACTIVE_STATUSES)
        .select_related("owner")
        .only("id", "name", "owner", "owner__username", "spec", "status", "predicted", "gpus")
        .order_by("id")
    )
    views = []
    for job in rows:
        gids = gids_of.get(job.pk, ())
        if len(gids) != job.gpus:
            continue  # a job whose allocation rows are being replaced right now
        details = can_see_details(user, job)
        views.append(
            job_view(
                topo,
                id=job.pk,
                label=job_label(user, job),
                details=details,
                job=load_job(job.spec),
                gids=gids,
                predicted=job.predicted if details else _public_prediction(job.predicted),
                flows=flows_of.get(job.pk),
                status=job.status,
                url=reverse("dashboard:job", args=[job.pk]) if details else None,
                traffic=job.predicted,
            )
        )
    queued = Job.objects.filter(cluster=cluster, status__in=WAITING_STATUSES).count()
    return ClusterGraphData(cluster, snap, layout_for(topo), views, queued)


def _public_prediction(predicted: dict | None) -> dict:
    # Other users' jobs still colour the metric overlays, but without their groups.
    p = predicted or {}
    return {k: p.get(k) for k in ("comm_ms", "step_ms", "mfu")}


def queue_jobs(
    *, user, statuses: Iterable[str], owner: str = "", cluster: Cluster | None = None
) -> QuerySet[Job]:
    """Jobs of the queue page, highest priority and oldest first, filtered by status, owner
    username and cluster. Every user sees every job here; labels hide other users' details, and
    a user who may not see all jobs filtering by another owner gets nothing (ownership is not
    revealed)."""
    jobs = Job.objects.select_related("cluster", "owner").filter(status__in=list(statuses))
    if owner:
        if owner != user.get_username() and not roles.sees_all_jobs(user):
            return jobs.none()
        jobs = jobs.filter(owner__username=owner)
    if cluster is not None:
        jobs = jobs.filter(cluster=cluster)
    return jobs.order_by("-priority", "submitted_at", "id")


def job_proposals(*, job: Job) -> QuerySet[MigrationProposal]:
    """The job's migration proposals, newest first."""
    return job.migration_proposals.select_related("decided_by").order_by("-created_at", "-id")


def graph_signature(*, cluster: Cluster, user) -> tuple:
    """A cheap key (two queries) that changes whenever the cluster graph `user` sees would:
    topology edits, allocations booked or released, job status or prediction changes."""
    live = Allocation.objects.filter(live=True, job__cluster=cluster).aggregate(
        n=Count("id"), top=Max("id"), total=Sum("id")
    )
    jobs = tuple(
        Job.objects.filter(cluster=cluster, status__in=(*ACTIVE_STATUSES, *WAITING_STATUSES))
        .order_by("id")
        .values_list("id", "status", "predicted_step_ms")
    )
    stamp = Cluster.objects.filter(pk=cluster.pk).values_list("updated_at", flat=True).first()
    viewer = "all" if roles.sees_all_jobs(user) else user.pk
    return (cluster.pk, stamp, live["n"], live["top"], live["total"], jobs, viewer)

"""Read-only queries of the scheduling app, for views, templates, serializers and the dashboard."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Exists, OuterRef, QuerySet

from apps.api import roles
from apps.placement.topology import SpecError
from apps.topology.models import Cluster, Gpu
from apps.topology.selectors import cluster_named

from . import snapshot as snap
from .choices import ACTIVE_STATUSES, WAITING_STATUSES, ProposalStatus
from .models import Allocation, Job, LauncherToken, MigrationProposal, SchedulingCycle


def jobs_visible_to(
    *, user: AbstractBaseUser | AnonymousUser, launcher: LauncherToken | None = None
) -> QuerySet[Job]:
    """Jobs a caller may see: a launcher token its cluster's, a user holding scheduling.view_job
    (viewer, operator, admin) all, another user their own."""
    base = Job.objects.select_related("cluster", "owner")
    if launcher is not None:
        return base.filter(cluster_id=launcher.cluster_id)
    if roles.sees_all_jobs(user):
        return base.all()
    if not getattr(user, "is_authenticated", False):
        return base.none()
    return base.filter(owner=user)


MASKED = "********"


def spec_shown(*, job: Job, user=None, node=None) -> dict:
    """The job's stored spec as `user` (or the node agent of `node`) may see it: in full for its
    owner and for a node running one of its ranks; for everyone else the `env` values are masked
    (the names stay), since people put secrets there."""
    spec = job.spec
    env = spec.get("env") if isinstance(spec, dict) else None
    if not env or (user is not None and user.pk is not None and user.pk == job.owner_id):
        return spec
    if node is not None and jobs_on_node(node=node).filter(pk=job.pk).exists():
        return spec
    return {**spec, "env": dict.fromkeys(env, MASKED)}


def jobs_on_node(*, node) -> QuerySet[Job]:
    """Jobs with a live rank on `node` (what its node agent may speak for)."""
    on = Allocation.objects.filter(job=OuterRef("pk"), live=True, node_name=node.name)
    return (
        Job.objects.select_related("cluster", "owner").filter(cluster_id=node.cluster_id).filter(Exists(on))
    )


def cluster_for_spec(*, spec: Any, name: str | None = None, recent: bool = False) -> Cluster:
    """The cluster a spec is for: `name` if given, else the spec's `cluster` field. SpecError on
    `cluster` when neither names an existing cluster. `recent=True`: a row this process read a
    moment ago may answer (`topology.selectors.cluster_named`)."""
    name = name or (spec.get("cluster") if isinstance(spec, dict) else None)
    if not name:
        raise SpecError([("cluster", "required: name the cluster in the spec or submit to one")])
    name = str(name)
    found = cluster_named(name, recent=recent)
    # An id is up to 18 ASCII digits ("²" passes isdigit() but int() refuses it).
    if found is None and name.isascii() and name.isdigit() and len(name) <= 18:
        found = Cluster.objects.filter(pk=int(name)).first()
    if found is None:
        raise SpecError([("cluster", f"unknown cluster {name[:40]!r}")])
    return found


def queue_for_cluster(*, cluster: Cluster) -> QuerySet[Job]:
    """The cluster's waiting jobs (queued or preempted) in the order the cycle walks them:
    priority (high first), then submission time."""
    return Job.objects.filter(cluster=cluster, status__in=WAITING_STATUSES).order_by(
        "-priority", "submitted_at", "id"
    )


def running_jobs(*, cluster: Cluster) -> QuerySet[Job]:
    """Jobs holding GPUs on the cluster (placing or running), oldest placement first."""
    return Job.objects.filter(cluster=cluster, status__in=ACTIVE_STATUSES).order_by("placed_at", "id")


def free_gpus(*, cluster: Cluster) -> QuerySet[Gpu]:
    """GPUs of the cluster with no live allocation, by node order and index."""
    live = Allocation.objects.filter(gpu=OuterRef("pk"), live=True)
    return (
        Gpu.objects.filter(node__cluster=cluster)
        .exclude(Exists(live))
        .select_related("node")
        .order_by("node__position", "node_id", "index")
    )


def link_loads(*, cluster: Cluster) -> dict[str, float]:
    """Heavy flows on each leaf's uplinks (leaf name -> sum of the active jobs' flows)."""
    loads: dict[str, float] = {}
    for flows in running_jobs(cluster=cluster).values_list("flows", flat=True):
        for leaf, flow in (flows or {}).items():
            loads[leaf] = loads.get(leaf, 0.0) + float(flow)
    return loads


def gpu_assignments(*, cluster: Cluster) -> dict[tuple[str, int], tuple[int, int]]:
    """Live allocations of the cluster: (node name, GPU index) -> (job id, rank)."""
    rows = Allocation.objects.filter(live=True, job__cluster=cluster).values_list(
        "gpu__node__name", "gpu__index", "job_id", "rank"
    )
    return {(node, index): (job_id, rank) for node, index, job_id, rank in rows}


def job_ranks(*, job: Job) -> list[dict[str, Any]]:
    """The job's current (or, once finished, last) placement by rank: rank, node, gpu index, nic.

    The rows of its current generation (a migrating job's new GPUs, some still waiting for the
    old ranks); a job placed before generations existed shows its live rows. Live rows name their
    GPU as the topology names it now; a finished job's released rows by the values they were
    booked with (its GPUs may since have been replaced).
    """
    rows = Allocation.objects.filter(job=job, generation=job.generation)
    if not rows.exists():
        rows = Allocation.objects.filter(job=job)
    fields = ("rank", "gpu__node__name", "gpu__index", "gpu__nic__name")
    if rows.filter(live=True).exists():
        rows = rows.filter(live=True)
    else:
        fields = ("rank", "node_name", "gpu_index", "nic_name")
    return [
        {"rank": rank, "node": node, "gpu": index, "nic": nic or ""}
        for rank, node, index, nic in rows.order_by("rank").values_list(*fields)
    ]


def job_placement(*, job: Job) -> dict[str, Any] | None:
    """The job's placement in the placement output format (job, policy, ranks, predicted), or
    None if it was never placed."""
    ranks = job_ranks(job=job)
    if not ranks:
        return None
    return {
        "job": job.name,
        "policy": job.placed_policy,
        "ranks": [{"rank": r["rank"], "node": r["node"], "gpu": r["gpu"]} for r in ranks],
        "predicted": job.predicted,
    }


def placement_preview(*, cluster: Cluster, spec: Any, username: str) -> dict[str, Any]:
    """Every policy's placement of a job spec on the cluster's free GPUs now, with predicted
    comm/step (ms) and MFU, plus the lower bound; nothing is booked. SpecError on a bad spec."""
    return snap.preview(cluster=cluster, data=spec, username=username)


def latest_cycle(*, cluster: Cluster) -> SchedulingCycle | None:
    """The most recent scheduling cycle of the cluster, or None."""
    return SchedulingCycle.objects.filter(cluster=cluster).order_by("-started_at", "-id").first()


def open_proposals(*, cluster: Cluster | None = None) -> QuerySet[MigrationProposal]:
    """Migration proposals still awaiting a decision, best gain first."""
    qs = MigrationProposal.objects.filter(status=ProposalStatus.PROPOSED).select_related(
        "job", "job__cluster"
    )
    if cluster is not None:
        qs = qs.filter(job__cluster=cluster)
    return qs.order_by("-predicted_gain", "id")


def proposals_visible_to(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[MigrationProposal]:
    """Proposals a user may see: all with scheduling.view_migrationproposal, else their own jobs'."""
    qs = MigrationProposal.objects.select_related("job", "job__cluster", "job__owner")
    if roles.can(user, "scheduling.view_migrationproposal"):
        return qs.all()
    if not getattr(user, "is_authenticated", False):
        return qs.none()
    return qs.filter(job__owner=user)

"""What does not converge: the lifecycle's invariants checked against the rows, plus whatever the
cluster's executor finds on its side (`Executor.check`). Read only; `manage.py reconcile --check`
prints it and exits non-zero, and beat logs it (`scheduling.reconcile_check`).

- booked-without-rank: a live allocation whose rank is not counted running although its job no
  longer runs that generation (nothing will ever release it);
- two-generations: one job with ranks of two generations running at once;
- the executor's own (the node agents: ranks that do not stop, down nodes past their fence
  deadline; Slurm: its jobs that TopoWeb no longer holds live).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from apps.topology.models import Cluster

from .choices import JobStatus, RankState
from .executor import Finding, executor_for
from .models import Allocation, RankRun


def booked_without_rank() -> QuerySet[Allocation]:
    """Live allocations whose rank is not counted running although their job no longer runs that
    generation: nothing will ever release them (the findings and `/metrics` count them)."""
    running_rank = RankRun.objects.filter(
        job_id=OuterRef("job_id"),
        generation=OuterRef("generation"),
        rank=OuterRef("rank"),
        state=RankState.STARTED,
    )
    wanted = Q(job__status__in=(JobStatus.PLACING, JobStatus.RUNNING), generation=F("job__generation")) | Q(
        job__status=JobStatus.MIGRATING
    )
    return Allocation.objects.filter(live=True).exclude(wanted).exclude(Exists(running_rank))


def findings(*, cluster: Cluster, now: datetime | None = None) -> list[Finding]:
    """Everything on `cluster` that should not be, the executor's findings last."""
    now = now or timezone.now()
    out: list[Finding] = []
    stray = (
        booked_without_rank()
        .filter(job__cluster=cluster)
        .values_list("job_id", "generation", "rank", "node_name", "gpu_index")
        .order_by("job_id", "generation", "rank")
    )
    out += [
        Finding(
            "booked-without-rank",
            f"{node} GPU {gpu} is booked for rank {rank} of job {job} generation {gen}, which runs no process",
        )
        for job, gen, rank, node, gpu in stray
    ]
    doubled = (
        RankRun.objects.filter(job__cluster=cluster, state=RankState.STARTED)
        .values("job_id")
        .annotate(generations=Count("generation", distinct=True))
        .filter(generations__gt=1)
        .order_by("job_id")
    )
    out += [
        Finding(
            "two-generations", f"job {row['job_id']} runs ranks of {row['generations']} generations at once"
        )
        for row in doubled
    ]
    return out + executor_for(cluster.pk).check(cluster)

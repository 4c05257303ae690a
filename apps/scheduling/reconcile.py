"""What does not converge: the lifecycle's invariants checked against the rows, plus whatever the
cluster's executor finds on its side (`Executor.check`). Read only; `manage.py reconcile --check`
prints it and exits non-zero, and beat logs it (`scheduling.reconcile_check`).

- booked-without-rank: a live allocation whose rank is not counted running although its job no
  longer runs that generation (nothing will ever release it);
- stop-overdue: a rank told to stop longer ago than its stop grace plus the time a cut-off node
  takes to be declared down, on a node that is not down (its executor does not stop it);
- fenced-not-freed: ranks still counted running on a down node past its fence deadline (the
  periodic reconcile is not running);
- two-generations: one job with ranks of two generations running at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count, Exists, F, OuterRef, Q
from django.utils import timezone

from apps.topology.models import Cluster

from . import snapshot as snap
from .agents import down_after_s, fence_deadline
from .choices import JobStatus, NodeState, RankState
from .executor import Finding, executor_for
from .models import Allocation, Job, NodeAgent, RankRun


def findings(*, cluster: Cluster, now: datetime | None = None) -> list[Finding]:
    """Everything on `cluster` that should not be, the executor's findings last."""
    now = now or timezone.now()
    out: list[Finding] = []
    running_rank = RankRun.objects.filter(
        job_id=OuterRef("job_id"),
        generation=OuterRef("generation"),
        rank=OuterRef("rank"),
        state=RankState.STARTED,
    )
    wanted = Q(job__status__in=(JobStatus.PLACING, JobStatus.RUNNING), generation=F("job__generation")) | Q(
        job__status=JobStatus.MIGRATING
    )
    stray = (
        Allocation.objects.filter(job__cluster=cluster, live=True)
        .exclude(wanted)
        .exclude(Exists(running_rank))
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
    stopping = (
        RankRun.objects.filter(job__cluster=cluster, state=RankState.STARTED, stop_requested_at__isnull=False)
        .exclude(node__agent__state=NodeState.DOWN)
        .select_related("node", "job")
        .order_by("stop_requested_at")
    )
    for run in stopping:
        overdue = timedelta(seconds=snap.job_spec(run.job).launch.stop_grace_s + down_after_s())
        if run.stop_requested_at + overdue < now:
            out.append(
                Finding(
                    "stop-overdue",
                    f"rank {run.rank} of job {run.job_id} generation {run.generation} on {run.node.name}"
                    f" was told to stop at {run.stop_requested_at:%Y-%m-%d %H:%M:%S} and still runs",
                )
            )
    down = NodeAgent.objects.filter(
        node__cluster=cluster, state=NodeState.DOWN, node__rank_runs__state=RankState.STARTED
    ).distinct()
    for agent in down.select_related("node"):
        jobs = Job.objects.filter(rank_runs__node=agent.node, rank_runs__state=RankState.STARTED).distinct()
        grace = max((snap.job_spec(j).launch.stop_grace_s for j in jobs.only("pk", "spec")), default=0.0)
        deadline = fence_deadline(last_seen=agent.last_seen, grace_s=grace)
        if deadline is None or deadline < now - timedelta(seconds=down_after_s()):
            out.append(
                Finding(
                    "fenced-not-freed",
                    f"{agent.node.name} is down past its fence deadline and still holds ranks counted running",
                )
            )
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

"""Accounting, as sacct and sreport give it: per finished job its wait, runtime, exit code and
GPU-hours; per user, account or cluster over a period the GPU-seconds used inside it, jobs, mean
wait and mean MFU."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Avg, Q

from apps.api import roles
from apps.metrics.models import JobSample
from apps.scheduling import usage as booked
from apps.scheduling.choices import FINISHED_STATUSES, JobStatus, RankState
from apps.scheduling.models import Job, RankRun

USAGE_COLUMNS = (
    "user",
    "jobs",
    "completed",
    "failed",
    "cancelled",
    "gpu_seconds",
    "gpu_hours",
    "mean_wait_s",
    "mean_mfu",
)


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else max(0.0, (b - a).total_seconds())


def job_accounting(jobs: Iterable[Job]) -> dict[int, dict]:
    """By job id: `wait_s` (submitted to started), `runtime_s` (started to finished, or to now
    while running: None), `gpu_hours` (GPUs × runtime) and `exit_code` (0 for a completed job,
    the first non-zero exit of a failed one's ranks, None when no rank ran or it was cancelled)."""
    jobs = list(jobs)
    failed = [j.pk for j in jobs if j.status == JobStatus.FAILED]
    codes: dict[int, int] = {}
    if failed:
        runs = (
            RankRun.objects.filter(job_id__in=failed, state=RankState.EXITED)
            .exclude(exit_code=0)
            .exclude(exit_code__isnull=True)
            .order_by("job_id", "-generation", "exited_at", "rank")
            .values_list("job_id", "exit_code")
        )
        for job_id, code in runs:
            codes.setdefault(job_id, code)
    out = {}
    for job in jobs:
        runtime = _seconds(job.started_at, job.finished_at)
        out[job.pk] = {
            "wait_s": _seconds(job.submitted_at, job.started_at),
            "runtime_s": runtime,
            "gpu_hours": None if runtime is None else job.gpus * runtime / 3600,
            "exit_code": 0 if job.status == JobStatus.COMPLETED else codes.get(job.pk),
        }
    return out


def usage_by_user(*, user, since: datetime, until: datetime, cluster=None, by: str = "user") -> list[dict]:
    """Use in [since, until) per owner, account ("(none)" without one) or cluster (`by`): the
    GPU-seconds every job held inside the period (running jobs up to now, jobs that straddle an
    edge only their part; `apps.scheduling.usage`, the Accounts table's and fair share's source
    too), jobs (that held GPUs in the period or finished in it), counts by outcome of those that
    finished in it, mean wait (seconds, jobs that started) and mean MFU (each job's measured
    mean where sampled, else its prediction). Users who may not see every job get their own only."""
    alloc = Q()
    finished = Job.objects.filter(status__in=FINISHED_STATUSES, finished_at__gte=since, finished_at__lt=until)
    if cluster is not None:
        alloc &= Q(job__cluster=cluster)
        finished = finished.filter(cluster=cluster)
    if not roles.sees_all_jobs(user):
        alloc &= Q(job__owner=user)
        finished = finished.filter(owner=user)
    seconds, ran = booked.gpu_seconds_by(by=by, since=since, until=until, jobs=alloc)
    ids = set(finished.values_list("id", flat=True)).union(*ran.values())
    jobs = list(
        Job.objects.filter(id__in=ids)
        .select_related("owner", "account", "cluster")
        .only(
            "id",
            "owner__username",
            "account__name",
            "cluster__name",
            "status",
            "gpus",
            "submitted_at",
            "started_at",
            "finished_at",
            "predicted_mfu",
        )
    )
    acct = job_accounting(jobs)
    measured = dict(
        JobSample.objects.filter(job_id__in=ids, mfu__isnull=False)
        .values("job_id")
        .annotate(mfu=Avg("mfu"))
        .values_list("job_id", "mfu")
    )
    rows: dict[str, dict] = {}
    for job in jobs:
        if by == "account":
            name = job.account.name if job.account_id else booked.NONE
        elif by == "cluster":
            name = job.cluster.name
        else:
            name = job.owner.get_username()
        r = rows.setdefault(
            name,
            {"user": name, "jobs": 0, "completed": 0, "failed": 0, "cancelled": 0, "_w": [], "_m": []},
        )
        r["jobs"] += 1
        if (
            job.status in FINISHED_STATUSES
            and job.finished_at is not None
            and since <= job.finished_at < until
        ):
            r[job.status] += 1
        a = acct[job.pk]
        if a["wait_s"] is not None:
            r["_w"].append(a["wait_s"])
        mfu = measured.get(job.pk, job.predicted_mfu)
        if mfu is not None:
            r["_m"].append(mfu)
    out = []
    for r in rows.values():
        waits, mfus = r.pop("_w"), r.pop("_m")
        r["gpu_seconds"] = seconds.get(r["user"], 0.0)
        r["gpu_hours"] = r["gpu_seconds"] / 3600
        r["mean_wait_s"] = sum(waits) / len(waits) if waits else None
        r["mean_mfu"] = sum(mfus) / len(mfus) if mfus else None
        out.append(r)
    return sorted(out, key=lambda r: (-r["gpu_seconds"], r["user"]))

"""Accounting, as sacct gives it: per finished job its wait, runtime, exit code and GPU-hours;
per user over a period their jobs, GPU-hours, mean wait and mean MFU."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Avg

from apps.api import roles
from apps.metrics.models import JobSample
from apps.scheduling.choices import FINISHED_STATUSES, JobStatus, RankState
from apps.scheduling.models import Job, RankRun

USAGE_COLUMNS = ("user", "jobs", "completed", "failed", "cancelled", "gpu_hours", "mean_wait_s", "mean_mfu")


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
    """Jobs finished in [since, until) per owner (`by="user"`) or per account the jobs were
    submitted under (`by="account"`, "(none)" without one): counts by outcome, GPU-hours, mean
    wait (seconds, jobs that started) and mean MFU (each job's measured mean where sampled, else
    its prediction; the mean over jobs). Users who may not see every job get their own jobs only."""
    jobs = Job.objects.filter(status__in=FINISHED_STATUSES, finished_at__gte=since, finished_at__lt=until)
    if cluster is not None:
        jobs = jobs.filter(cluster=cluster)
    if not roles.sees_all_jobs(user):
        jobs = jobs.filter(owner=user)
    jobs = list(
        jobs.select_related("owner").only(
            "id",
            "owner__username",
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
        JobSample.objects.filter(job_id__in=[j.pk for j in jobs], mfu__isnull=False)
        .values("job_id")
        .annotate(mfu=Avg("mfu"))
        .values_list("job_id", "mfu")
    )
    rows: dict[str, dict] = {}
    for job in jobs:
        if by == "account":
            name = job.account.name if job.account_id else "(none)"
        else:
            name = job.owner.get_username()
        r = rows.setdefault(
            name,
            {
                "user": name,
                "jobs": 0,
                "completed": 0,
                "failed": 0,
                "cancelled": 0,
                "gpu_hours": 0.0,
                "_w": [],
                "_m": [],
            },
        )
        r["jobs"] += 1
        r[job.status] += 1
        a = acct[job.pk]
        r["gpu_hours"] += a["gpu_hours"] or 0.0
        if a["wait_s"] is not None:
            r["_w"].append(a["wait_s"])
        mfu = measured.get(job.pk, job.predicted_mfu)
        if mfu is not None:
            r["_m"].append(mfu)
    out = []
    for r in sorted(rows.values(), key=lambda r: (-r["gpu_hours"], r["user"])):
        waits, mfus = r.pop("_w"), r.pop("_m")
        r["mean_wait_s"] = sum(waits) / len(waits) if waits else None
        r["mean_mfu"] = sum(mfus) / len(mfus) if mfus else None
        out.append(r)
    return out

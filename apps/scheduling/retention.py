"""Retention of the scheduling app's rows: what it keeps, and for how long.

Part of the control plane's retention (`apps.metrics.retention.retention_apply`, run daily by the
beat task `metrics.retention` and by `manage.py retention`), which also deletes old metrics
reports. Each kind of row has its own age limit (settings from TOPOWEB_RETAIN_*_DAYS; 0 keeps it
forever):

- rank records (`RankRun`) whose process exited before RETAIN_RANK_RECORDS_DAYS, unless their job
  has not finished and they are of its current generation (the job completes only once every
  rank of it exited 0), and before that the output tails they carry, emptied after
  RETAIN_OUTPUT_DAYS;
- finished jobs' launch fields (`command`, `env`, `workdir`) dropped from their stored spec after
  RETAIN_JOB_SPECS_DAYS: the rest of the spec (shape, comm, model) stays for the job's page;
- audit rows: scheduling cycles and the admin's log entries older than RETAIN_AUDIT_DAYS.

Deletes run in batches of BATCH rows so a first run over a long history never holds one huge
transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from .choices import FINISHED_STATUSES
from .models import Job, RankRun, SchedulingCycle

BATCH = 5000
LAUNCH_KEYS = ("command", "env", "workdir")


def cutoff(days: float, now: datetime) -> datetime | None:
    """The oldest time kept under a limit of `days` (None: 0 keeps forever)."""
    return None if days <= 0 else now - timedelta(days=days)


def delete_in_batches(queryset) -> int:
    """Delete the rows of `queryset`, BATCH at a time, each batch in its own transaction; returns
    how many."""
    model = queryset.model
    total = 0
    while True:
        ids = list(queryset.values_list("pk", flat=True)[:BATCH])
        if not ids:
            return total
        with transaction.atomic():
            model.objects.filter(pk__in=ids).delete()
        total += len(ids)


def scheduling_retain(*, now: datetime | None = None) -> dict[str, int]:
    """Delete or trim the scheduling rows past their retention; returns how many of each kind."""
    now = now or timezone.now()
    done = dict.fromkeys(("output_tails", "rank_records", "job_specs", "cycles", "log_entries"), 0)
    cut = cutoff(settings.RETAIN_OUTPUT_DAYS, now)
    if cut:
        while True:
            ids = list(
                RankRun.objects.filter(exited_at__lt=cut)
                .exclude(log_tail="")
                .values_list("pk", flat=True)[:BATCH]
            )
            if not ids:
                break
            done["output_tails"] += RankRun.objects.filter(pk__in=ids).update(log_tail="")
    cut = cutoff(settings.RETAIN_RANK_RECORDS_DAYS, now)
    if cut:
        # Only records no job still counts on: a job that has not finished needs every exit of
        # its current generation to complete (an early exit 0 is one of them).
        needed = Q(job__generation=F("generation")) & ~Q(job__status__in=FINISHED_STATUSES)
        done["rank_records"] = delete_in_batches(RankRun.objects.filter(exited_at__lt=cut).exclude(needed))
    cut = cutoff(settings.RETAIN_JOB_SPECS_DAYS, now)
    if cut:
        done["job_specs"] = _trim_specs(cut)
    cut = cutoff(settings.RETAIN_AUDIT_DAYS, now)
    if cut:
        done["cycles"] = delete_in_batches(SchedulingCycle.objects.filter(started_at__lt=cut))
        done["log_entries"] = delete_in_batches(LogEntry.objects.filter(action_time__lt=cut))
    return done


def _trim_specs(cut: datetime) -> int:
    """Drop the launch fields from the specs of jobs finished before `cut`; returns how many."""
    stale = Job.objects.filter(
        status__in=FINISHED_STATUSES, finished_at__lt=cut, spec__has_any_keys=list(LAUNCH_KEYS)
    ).order_by("pk")
    total = 0
    while True:
        jobs = list(stale.only("pk", "spec")[:BATCH])
        if not jobs:
            return total
        for job in jobs:
            job.spec = {k: v for k, v in job.spec.items() if k not in LAUNCH_KEYS}
        with transaction.atomic():
            Job.objects.bulk_update(jobs, ["spec"], batch_size=500)
        total += len(jobs)

"""Retention: what the control plane keeps, and for how long.

Run daily by Celery beat (`metrics.retention`) and by `manage.py retention`. Each kind of row has
its own age limit (settings from TOPOWEB_RETAIN_*_DAYS; 0 keeps it forever):

- metrics reports (`JobReport`) older than RETAIN_REPORTS_DAYS (here);
- the scheduling app's rows: rank records and their output tails, finished jobs' launch fields,
  scheduling cycles and the admin's log (`apps.scheduling.retention.scheduling_retain`).

It lives in the metrics app because metrics sits above scheduling: it may import scheduling's
part, scheduling may not import metrics. Raw samples and rollups have their own, shorter cycle
(`services.metrics_retain`, every minute).
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.utils import timezone

from apps.scheduling.retention import cutoff, delete_in_batches, scheduling_retain

from .models import JobReport


def reports_retain(*, now: datetime | None = None) -> int:
    """Delete the jobs' metrics reports past RETAIN_REPORTS_DAYS; returns how many."""
    cut = cutoff(settings.RETAIN_REPORTS_DAYS, now or timezone.now())
    return delete_in_batches(JobReport.objects.filter(at__lt=cut)) if cut else 0


def retention_apply(*, now: datetime | None = None) -> dict[str, int]:
    """Delete or trim what is past its retention; returns how many rows of each kind (`reports`,
    then the scheduling kinds: `output_tails`, `rank_records`, `job_specs`, `cycles`,
    `log_entries`)."""
    now = now or timezone.now()
    return {"reports": reports_retain(now=now), **scheduling_retain(now=now)}

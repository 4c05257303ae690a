"""The control plane's retention (apps/metrics/retention.py): old metrics reports go, then the
scheduling rows (their rules: tests/unit/scheduling/test_retention.py); `manage.py retention` and
the daily beat task run it all."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.utils import timezone

from apps.metrics.models import JobReport
from apps.metrics.retention import retention_apply
from apps.metrics.tasks import BEAT_SCHEDULE, retention_task
from apps.scheduling.demo import load_demo_jobs
from apps.scheduling.models import Job

pytestmark = pytest.mark.django_db

KINDS = ["reports", "output_tails", "rank_records", "job_specs", "cycles", "log_entries"]


@pytest.fixture
def job(case44):
    load_demo_jobs(start_all=True)
    return Job.objects.filter(cluster=case44).first()


def test_old_reports_go_recent_ones_stay_and_every_kind_is_counted(job, settings):
    settings.RETAIN_REPORTS_DAYS = 30
    now = timezone.now()
    for days in (31, 1):
        JobReport.objects.create(job=job, step_ms=100.0, at=now - timedelta(days=days))

    done = retention_apply(now=now)

    assert list(done) == KINDS
    assert done["reports"] == 1
    assert list(JobReport.objects.values_list("at", flat=True)) == [now - timedelta(days=1)]
    assert retention_apply(now=now)["reports"] == 0


def test_zero_keeps_forever_and_the_command_and_beat_run_it(job, settings, capsys):
    settings.RETAIN_REPORTS_DAYS = 0
    JobReport.objects.create(job=job, step_ms=1.0, at=timezone.now() - timedelta(days=3650))
    call_command("retention")
    assert JobReport.objects.count() == 1
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines()] == KINDS
    assert "reports: 0" in out
    assert list(retention_task()) == KINDS
    assert BEAT_SCHEDULE["metrics-retention"]["task"] == "metrics.retention"
    assert django_settings.CELERY_BEAT_SCHEDULE["metrics-retention"] == BEAT_SCHEDULE["metrics-retention"]

    from topoweb.celery import app

    assert "metrics.retention" in app.tasks

"""Retention deletes what is old and keeps what is not."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.management import call_command
from django.utils import timezone

from apps.metrics.models import JobReport
from apps.scheduling import services
from apps.scheduling.choices import RankState
from apps.scheduling.models import Job, RankRun, SchedulingCycle
from apps.scheduling.retention import retention_apply
from apps.scheduling.tasks import BEAT_SCHEDULE
from apps.topology.models import Node

from .conftest import small_spec

pytestmark = pytest.mark.django_db


def test_old_rows_go_and_recent_ones_stay(case44, alice, committed, settings):
    settings.RETAIN_REPORTS_DAYS = 30
    settings.RETAIN_RANK_RECORDS_DAYS = 30
    settings.RETAIN_OUTPUT_DAYS = 7
    settings.RETAIN_JOB_SPECS_DAYS = 30
    settings.RETAIN_AUDIT_DAYS = 90
    now = timezone.now()
    spec = small_spec("old", 4, command=["python", "train.py"], env={"KEY": "secret"})
    old = committed(services.job_submit, user=alice, spec=spec)
    committed(services.job_cancel, job=old)
    new = committed(services.job_submit, user=alice, spec={**spec, "name": "new"})
    committed(services.job_cancel, job=new)
    Job.objects.filter(pk=old.pk).update(finished_at=now - timedelta(days=31))
    for days in (31, 1):
        JobReport.objects.create(job=old, step_ms=100.0, at=now - timedelta(days=days))
    node = Node.objects.filter(cluster=case44).first()
    for rank, days in enumerate((31, 8, 1)):
        RankRun.objects.create(
            job=old,
            generation=1,
            rank=rank,
            node=node,
            state=RankState.EXITED,
            exited_at=now - timedelta(days=days),
            log_tail=f"output {rank}",
        )
    SchedulingCycle.objects.update(started_at=now - timedelta(days=91))
    recent_cycle = SchedulingCycle.objects.create(cluster=case44, policy="topo")
    for days in (91, 1):
        entry = LogEntry.objects.create(user=alice, action_flag=CHANGE, object_repr="x", change_message="m")
        LogEntry.objects.filter(pk=entry.pk).update(action_time=now - timedelta(days=days))

    done = retention_apply(now=now)

    assert list(JobReport.objects.values_list("at", flat=True)) == [now - timedelta(days=1)]
    assert dict(RankRun.objects.values_list("rank", "log_tail")) == {1: "", 2: "output 2"}
    old.refresh_from_db()
    new.refresh_from_db()
    assert not {"command", "env", "workdir"} & set(old.spec) and old.spec["gpus"] == 4
    assert new.spec["env"] == {"KEY": "secret"}
    assert list(SchedulingCycle.objects.values_list("pk", flat=True)) == [recent_cycle.pk]
    assert LogEntry.objects.count() == 1
    assert done["reports"] == 1 and done["rank_records"] == 1 and done["job_specs"] == 1
    # Nothing is left to do a second time.
    assert set(retention_apply(now=now).values()) == {0}


def test_zero_keeps_forever_and_the_command_and_beat_run_it(case44, alice, committed, settings, capsys):
    settings.RETAIN_REPORTS_DAYS = 0
    job = committed(services.job_submit, user=alice, spec=small_spec("j", 4))
    JobReport.objects.create(job=job, step_ms=1.0, at=timezone.now() - timedelta(days=3650))
    call_command("retention")
    assert JobReport.objects.count() == 1
    assert "reports: 0" in capsys.readouterr().out
    assert BEAT_SCHEDULE["scheduling-retention"]["task"] == "scheduling.retention"

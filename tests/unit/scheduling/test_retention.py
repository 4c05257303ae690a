"""Retention of the scheduling rows deletes what is old and keeps what is not (metrics reports and
the whole run: tests/unit/metrics/test_report_retention.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.utils import timezone

from apps.scheduling import services
from apps.scheduling.choices import RankState
from apps.scheduling.models import Job, RankRun, SchedulingCycle
from apps.scheduling.retention import scheduling_retain
from apps.topology.models import Node

from .conftest import small_spec

pytestmark = pytest.mark.django_db


def test_old_rows_go_and_recent_ones_stay(case44, alice, committed, settings):
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

    done = scheduling_retain(now=now)

    assert dict(RankRun.objects.values_list("rank", "log_tail")) == {1: "", 2: "output 2"}
    old.refresh_from_db()
    new.refresh_from_db()
    assert not {"command", "env", "workdir"} & set(old.spec) and old.spec["gpus"] == 4
    assert new.spec["env"] == {"KEY": "secret"}
    assert list(SchedulingCycle.objects.values_list("pk", flat=True)) == [recent_cycle.pk]
    assert LogEntry.objects.count() == 1
    assert done["rank_records"] == 1 and done["job_specs"] == 1
    # Nothing is left to do a second time.
    assert set(scheduling_retain(now=now).values()) == {0}


def test_zero_keeps_forever(case44, alice, committed, settings):
    for name in ("RANK_RECORDS", "OUTPUT", "JOB_SPECS", "AUDIT"):
        setattr(settings, f"RETAIN_{name}_DAYS", 0)
    job = committed(services.job_submit, user=alice, spec=small_spec("j", 4, command=["true"]))
    committed(services.job_cancel, job=job)
    long_ago = timezone.now() - timedelta(days=3650)
    Job.objects.filter(pk=job.pk).update(finished_at=long_ago)
    node = Node.objects.filter(cluster=case44).first()
    RankRun.objects.create(
        job=job, generation=1, rank=0, node=node, state=RankState.EXITED, exited_at=long_ago, log_tail="out"
    )
    SchedulingCycle.objects.update(started_at=long_ago)
    assert set(scheduling_retain().values()) == {0}
    assert RankRun.objects.get().log_tail == "out"

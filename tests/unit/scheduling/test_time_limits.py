"""time_limit_min: one launch field, bounded; the agents' server side stops a job past it with
the reason Slurm's TIMEOUT gets on a Slurm cluster."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.executors.agents.services import nodes_check
from apps.placement.jobs import load_job
from apps.placement.topology import SpecError
from apps.scheduling import services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Allocation, Job

from .conftest import small_spec

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("bad", [0, -1, 43201, 1.5, True, "10"])
def test_time_limit_is_bounded_and_named(case44, alice, bad):
    with pytest.raises(SpecError) as err:
        services.job_submit(user=alice, spec=small_spec("t", 2, time_limit_min=bad))
    assert "time_limit_min" in err.value.as_dict()


def test_time_limit_round_trips_and_defaults_to_none(case44, alice):
    job = services.job_submit(user=alice, spec=small_spec("t", 2, time_limit_min=90))
    assert job.time_limit_min == 90 and load_job(job.spec).launch.time_limit_min == 90
    plain = services.job_submit(user=alice, spec=small_spec("p", 2))
    assert plain.time_limit_min is None and load_job(plain.spec).launch.time_limit_min is None


def test_a_job_past_its_time_limit_is_failed_and_its_gpus_freed(case44, alice, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("t", 2, time_limit_min=5))
    other = committed(services.job_submit, user=alice, spec=small_spec("o", 2))
    for j in (job, other):
        j.refresh_from_db()
        services.job_start(job=j)
    now = timezone.now()
    Job.objects.filter(pk__in=[job.pk, other.pk]).update(started_at=now - timedelta(minutes=4, seconds=50))
    assert nodes_check(cluster=job.cluster, now=now)["timed_out"] == []
    out = nodes_check(cluster=job.cluster, now=now + timedelta(seconds=20))
    assert out["timed_out"] == [job.pk]
    job.refresh_from_db()
    other.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.pending_reason == "time limit: stopped after its time_limit_min of 5 min"
    assert other.status == JobStatus.RUNNING
    assert not Allocation.objects.filter(job=job, live=True).exists()

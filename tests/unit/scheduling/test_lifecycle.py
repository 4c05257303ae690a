"""Job lifecycle services: start, complete, fail, cancel, preempt, and what each releases."""

from __future__ import annotations

import pytest

from apps.scheduling import services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Allocation, Job

from .conftest import small_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed(case44, alice, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("eight", 8))
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING
    return job


def live(job: Job) -> int:
    return Allocation.objects.filter(job=job, live=True).count()


def test_start_moves_a_placed_job_to_running_and_repeats_harmlessly(placed):
    job = services.job_start(job=placed)
    assert job.status == JobStatus.RUNNING and job.started_at is not None
    again = services.job_start(job=job)
    assert again.started_at == job.started_at


def test_start_of_a_queued_job_is_refused(case44, alice, job_spec):
    job = services.job_submit(user=alice, spec=job_spec())
    with pytest.raises(services.JobStateError, match="cannot start job .* it is queued"):
        services.job_start(job=job)


def test_complete_releases_the_gpus_and_keeps_the_history(placed):
    services.job_start(job=placed)
    job = services.job_complete(job=placed)
    assert job.status == JobStatus.COMPLETED and job.finished_at is not None
    assert live(job) == 0
    assert Allocation.objects.filter(job=job, live=False, released_at__isnull=False).count() == 8


def test_fail_records_the_reason_and_releases(placed):
    job = services.job_fail(job=placed, reason="NCCL timeout on rank 3")
    assert job.status == JobStatus.FAILED and job.pending_reason == "NCCL timeout on rank 3"
    assert live(job) == 0


def test_complete_of_a_finished_job_is_refused(placed):
    services.job_complete(job=placed)
    with pytest.raises(services.JobStateError):
        services.job_complete(job=placed)


def test_cancel_of_a_queued_job_needs_no_gpus(case44, alice, job_spec):
    job = services.job_submit(user=alice, spec=job_spec())
    job = services.job_cancel(job=job, user=alice)
    assert job.status == JobStatus.CANCELLED and job.pending_reason == "cancelled by alice"


def test_cancel_of_a_running_job_frees_its_gpus_for_the_queue(placed, alice, committed):
    waiting = committed(services.job_submit, user=alice, spec=small_spec("sixteen", 16))
    assert Job.objects.get(pk=waiting.pk).status == JobStatus.QUEUED
    committed(services.job_cancel, job=placed, user=alice)
    assert live(placed) == 0
    assert Job.objects.get(pk=waiting.pk).status == JobStatus.PLACING


def test_cancel_twice_is_refused(placed, alice):
    services.job_cancel(job=placed, user=alice)
    with pytest.raises(services.JobStateError, match="it is cancelled"):
        services.job_cancel(job=placed, user=alice)


def test_operator_preemption_sends_the_job_back_to_the_queue(placed, committed):
    services.job_start(job=placed)
    job = services.job_preempt(job=placed, reason="maintenance on node-a")
    assert job.status == JobStatus.PREEMPTED and job.preemptions == 1
    assert job.pending_reason == "maintenance on node-a"
    assert live(job) == 0
    # Preempted counts as queued: the next cycle places it again.
    committed(lambda: services.schedule_cluster(cluster=job.cluster))
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING and live(job) == 8
    assert job.pending_reason == "" and job.requeue_reason == "maintenance on node-a"

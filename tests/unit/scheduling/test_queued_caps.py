"""Caps on waiting jobs (Slurm's MaxSubmitJobs): TOPOWEB_MAX_QUEUED_PER_USER counts a user's
queued and preempted jobs on every cluster; a single or bulk submission past it is a 409 naming
the limit, its value and the current count, and queues nothing. (The cycles requested on commit do
not run here, so submitted jobs stay queued; the race of concurrent clients is
tests/integration/test_queued_caps_postgres.py.)"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from apps.scheduling import accounts, lifecycle, services
from apps.scheduling.choices import WAITING_STATUSES, JobStatus
from apps.scheduling.models import Job, Qos

from .conftest import small_spec

pytestmark = pytest.mark.django_db

CAP = 3


@pytest.fixture(autouse=True)
def cap(settings):
    settings.MAX_QUEUED_PER_USER = CAP


def waiting(user) -> int:
    return Job.objects.filter(owner=user, status__in=WAITING_STATUSES).count()


def test_the_cap_over_the_api_names_the_limit_its_value_and_the_count(case44, alice, alice_api):
    for i in range(CAP):
        assert alice_api.post("/api/v1/jobs/", small_spec(f"j{i}", 2), format="json").status_code == 201
    response = alice_api.post("/api/v1/jobs/", small_spec("one-too-many", 2), format="json")
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["limit"] == "TOPOWEB_MAX_QUEUED_PER_USER"
    assert (body["value"], body["queued"]) == (CAP, CAP)
    assert "TOPOWEB_MAX_QUEUED_PER_USER" in body["detail"]
    assert waiting(alice) == CAP
    # With an Idempotency-Key too; a retry of a job already queued is still answered with it.
    key = {"HTTP_IDEMPOTENCY_KEY": "k-over"}
    assert alice_api.post("/api/v1/jobs/", small_spec("k", 2), format="json", **key).status_code == 409
    assert waiting(alice) == CAP


def test_a_bulk_submission_over_the_cap_queues_nothing(case44, alice, alice_api):
    services.job_submit(user=alice, spec=small_spec("first", 2))
    response = alice_api.post("/api/v1/jobs/", [small_spec(f"b{i}", 2) for i in range(CAP)], format="json")
    assert response.status_code == 409, response.content
    assert (response.json()["value"], response.json()["queued"]) == (CAP, 1)
    assert waiting(alice) == 1
    response = alice_api.post(
        "/api/v1/jobs/", [small_spec(f"b{i}", 2) for i in range(CAP - 1)], format="json"
    )
    assert response.status_code == 201, response.content
    assert waiting(alice) == CAP


def test_only_waiting_jobs_count_on_every_cluster(case44, pod256, alice, bob):
    jobs = [services.job_submit(user=alice, spec=small_spec(f"j{i}", 2)) for i in range(CAP - 1)]
    services.job_submit(user=alice, spec=small_spec("elsewhere", 8, cluster="pod-256"))
    with pytest.raises(services.QueuedCapExceeded) as exc:
        services.job_submit(user=alice, spec=small_spec("over", 2))
    assert (exc.value.limit, exc.value.value, exc.value.queued, exc.value.adding) == (
        "TOPOWEB_MAX_QUEUED_PER_USER",
        CAP,
        CAP,
        1,
    )
    # Another user's queue is their own.
    services.job_submit(user=bob, spec=small_spec("bobs", 2))
    # A cancelled job leaves the queue; a placed one (placing, running) is not waiting.
    services.job_cancel(job=jobs[0])
    services.job_submit(user=alice, spec=small_spec("after-cancel", 2))
    services.schedule_cluster(cluster=case44)
    assert Job.objects.filter(owner=alice, status=JobStatus.PLACING).exists()
    services.job_submit(user=alice, spec=small_spec("after-placing", 2))


def test_a_preempted_job_waits_and_counts(case44, alice):
    job = services.job_submit(user=alice, spec=small_spec("preempted", 2))
    services.schedule_cluster(cluster=case44)
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING
    lifecycle.requeue(job_id=job.pk, why="test", now=job.placed_at, preempted=True)
    assert Job.objects.get(pk=job.pk).status == JobStatus.PREEMPTED
    services.job_submit_many(user=alice, specs=[small_spec(f"m{i}", 16) for i in range(CAP - 1)])
    with pytest.raises(services.QueuedCapExceeded):
        services.job_submit_many(user=alice, specs=[small_spec("m", 16)])
    assert waiting(alice) == CAP


def test_one_function_computes_the_caps(alice, settings):
    settings.MAX_QUEUED_PER_USER = 20
    caps = accounts.queued_caps(alice)
    assert [(c.limit, c.value) for c in caps] == [("TOPOWEB_MAX_QUEUED_PER_USER", 20)]


def test_the_caps_kept_by_a_process_are_read_afresh_by_their_keys_alone(case44, alice):
    # The user's lock reads the caps of the rows it kept beside it: one row each by its key, so
    # no join of the QOS's cluster and no sort by the model's ordering (its cluster's name).
    qos = Qos.objects.get(cluster=case44, name="normal")
    expected, fresh = services._kept_caps([(None, qos)])
    lock = (
        get_user_model()
        .objects.filter(pk=alice.pk)
        .annotate(**services._fresh_annotations(fresh))
        .values_list("pk", *fresh)
    )
    sql = str(lock.query)
    assert "JOIN" not in sql and "ORDER BY" not in sql, sql
    assert lock.get()[1:] == expected

"""The API's and the cycle's hot paths stay cheap without changing what they return: the fast job
serializers equal DRF's field-by-field output, submissions and cycles cost a fixed number of
queries, and a burst of cycle requests is spaced out."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework import serializers

from apps.scheduling import cycle, services
from apps.scheduling.api.serializers import LIST_ROW_COLUMNS, JobListSerializer, JobSerializer, job_list_row
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Job
from apps.scheduling.tasks import schedule_cluster_task
from topoweb.celery import app as celery_app

from .conftest import small_spec

pytestmark = pytest.mark.django_db


def field_by_field(serializer_class, job: Job) -> dict:
    """What DRF's generic Serializer.to_representation makes of the job."""
    return dict(serializers.Serializer.to_representation(serializer_class(), job))


def test_fast_job_representation_matches_the_field_by_field_one(
    case44, alice, alice_api, committed, monkeypatch
):
    committed(services.job_submit, user=alice, spec=small_spec("placed", 8))
    running = committed(services.job_submit, user=alice, spec=small_spec("running", 4, policy="naive"))
    services.job_start(job=running)
    Job.objects.filter(pk=running.pk).update(started_at=timezone.now() - timedelta(hours=3), overdue=True)
    no_estimate = small_spec("done", 2)
    del no_estimate["estimated_runtime_s"]
    done = committed(services.job_submit, user=alice, spec=no_estimate)
    services.job_complete(job=done)
    committed(services.job_submit, user=alice, spec=small_spec("waits", 16))
    # One clock for both paths: the overdue reason counts seconds since the start.
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)
    jobs = list(Job.objects.select_related("cluster", "owner").order_by("id"))
    assert {j.status for j in jobs} == {
        JobStatus.PLACING,
        JobStatus.RUNNING,
        JobStatus.COMPLETED,
        JobStatus.QUEUED,
    }
    for job in jobs:
        for serializer_class in (JobListSerializer, JobSerializer):
            assert serializer_class(job).data == field_by_field(serializer_class, job), (
                job.name,
                serializer_class,
            )
    # The job list reads rows, not jobs: the same values.
    rows = Job.objects.order_by("id").values_list(*LIST_ROW_COLUMNS)
    tz = timezone.get_current_timezone()
    assert [job_list_row(row, tz) for row in rows] == [JobListSerializer(job).data for job in jobs]
    # And a job's detail, as the API answers it.
    for job in Job.objects.select_related("cluster", "owner", "account", "qos"):
        expected = JobSerializer(job, context={"request": SimpleNamespace(user=alice)}).data
        assert alice_api.get(f"/api/v1/jobs/{job.pk}/").json() == json.loads(json.dumps(expected)), job.name


def test_job_list_leaves_out_the_spec_predicted_block_and_flows(case44, alice, alice_api, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("placed", 8))
    [row] = alice_api.get("/api/v1/jobs/").json()["results"]
    detail = alice_api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert not {"spec", "predicted", "flows"} & set(row)
    assert set(row) < set(detail)
    assert {k: detail[k] for k in row} == row
    assert detail["spec"]["name"] == "placed" and detail["predicted"] and detail["flows"] is not None


def test_submission_with_the_cycle_on_a_worker_answers_queued_in_nine_queries(
    case44, alice_api, monkeypatch, django_assert_max_num_queries
):
    # The eager_celery fixture puts the setting back afterwards.
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = False
    monkeypatch.setattr(schedule_cluster_task, "delay", lambda *args: None)
    # The first submission loads the cluster's topology into the process cache.
    alice_api.post("/api/v1/jobs/", small_spec("first", 4), format="json")
    # Cluster by name, its executor, the user's account membership and the job's QOS, the user's
    # row locked and their waiting jobs counted (the queued-job caps), and the job's INSERT inside
    # its savepoint; no re-read, no topology stamp.
    with django_assert_max_num_queries(9):
        response = alice_api.post("/api/v1/jobs/", small_spec("q", 4), format="json")
    assert response.status_code == 201
    assert response.json()["status"] == "queued"
    assert response.json()["id"] == Job.objects.latest("id").pk


def test_submission_with_an_in_process_cycle_answers_with_the_placement(case44, alice_api):
    response = alice_api.post("/api/v1/jobs/", small_spec("p", 4), format="json")
    # Outside a test transaction the cycle runs on commit; here the job is re-read after it.
    assert response.json()["status"] == Job.objects.get().status


def test_a_cycle_books_any_number_of_jobs_in_the_same_number_of_statements(pod256, alice):
    def cycle_statements(n_jobs: int, first: int) -> int:
        for i in range(n_jobs):
            services.job_submit(user=alice, spec=small_spec(f"j{first + i}", 8, cluster="pod-256"))
        with CaptureQueriesContext(connection) as queries:
            record = services.schedule_cluster(cluster=pod256)
        assert record.placed == n_jobs
        return len(queries)

    cycle_statements(0, 0)  # loads the cluster's GPU index into the process cache
    # 10 jobs of 8 GPUs: 80 allocation rows fit one INSERT within SQLite's 999 parameters.
    assert cycle_statements(2, 0) == cycle_statements(10, 2)
    assert Job.objects.filter(status=JobStatus.PLACING).count() == 12


def test_bad_filter_values_are_still_refused_and_other_parameters_do_not_filter(case44, alice, alice_api):
    for i in range(3):
        services.job_submit(user=alice, spec=small_spec(f"j{i}", 1))
    assert alice_api.get("/api/v1/jobs/", {"status": "bogus"}).status_code == 400
    assert alice_api.get("/api/v1/jobs/", {"page_size": 2}).json()["count"] == 3
    assert alice_api.get("/api/v1/jobs/", {"priority_min": 1}).json()["count"] == 0


def test_a_requested_cycle_right_after_another_waits_out_the_gap(case44, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(cycle, "_LAST_END", {})
    monkeypatch.setattr(cycle, "coalescing", lambda: True)
    monkeypatch.setattr(cycle.time, "sleep", slept.append)
    cycle.schedule_requested(cluster=case44)
    assert slept == []
    cycle.schedule_requested(cluster=case44)
    assert len(slept) == 1 and 0 < slept[0] <= cycle.MIN_CYCLE_GAP_S


def test_without_coalescing_a_requested_cycle_never_waits(case44, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(cycle, "_LAST_END", {})
    monkeypatch.setattr(cycle, "coalescing", lambda: False)
    monkeypatch.setattr(cycle.time, "sleep", slept.append)
    cycle.schedule_requested(cluster=case44)
    cycle.schedule_requested(cluster=case44)
    assert slept == []


def test_waiting_reasons_are_written_in_batches_and_only_to_waiting_jobs(
    case44, alice, committed, monkeypatch
):
    from apps.scheduling import snapshot

    monkeypatch.setattr(snapshot, "REASON_BATCH", 3)
    jobs = [committed(services.job_submit, user=alice, spec=small_spec(f"j{i}", 16)) for i in range(7)]
    # The first one holds every GPU; the other six wait.
    statuses = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    assert list(statuses.values()).count(JobStatus.QUEUED) == 6
    with CaptureQueriesContext(connection) as queries:
        snapshot.write_waiting_reasons(reasons=[(j.pk, f"reason {j.name} 'quoted'") for j in jobs])
    assert len(queries.captured_queries) == 3
    got = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("name", "pending_reason"))
    assert got["j0"] == ""
    assert all(got[f"j{i}"] == f"reason j{i} 'quoted'" for i in range(1, 7))


def test_running_jobs_are_reranked_only_when_preemption_or_reclaim_may_pick_victims(case44, alice, committed):
    from apps.scheduling import accounts
    from apps.scheduling import snapshot as snap

    committed(services.job_submit, user=alice, spec=small_spec("running", 4))
    services.job_submit(user=alice, spec=small_spec("queued", 16))

    def ranked(preemption: bool):
        case44.preemption_enabled = preemption
        snapshot = snap.cluster_snapshot(cluster=case44)
        queue = snap.queued_jobs(cluster=case44, unreadable={})
        accounts.rank_jobs(cluster=case44, snapshot=snapshot, queue=queue, now=timezone.now())
        return snapshot.active, queue

    active, queue = ranked(False)
    assert [a.effective for a in active] == [None] and queue[0].effective is not None
    active, queue = ranked(True)
    assert active[0].effective is not None and queue[0].effective is not None

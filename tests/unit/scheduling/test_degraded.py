"""Degraded services, unit level: a cache that fails open, a broker that refuses tasks, a lost
cycle request, a redelivered cycle, and the 503 answered while the database is unreachable.

The same faults on the real Postgres, Redis and workers are in tests/integration/test_faults.py.
"""

from __future__ import annotations

import logging
import socket

import pytest
from django.db import OperationalError
from django.test import Client
from kombu.exceptions import OperationalError as BrokerUnavailable

from apps.scheduling import cycle, services, tasks
from apps.scheduling.choices import CycleStatus, JobStatus
from apps.scheduling.models import Job, SchedulingCycle
from topoweb.cache import FailOpenRedisCache

from .conftest import small_spec

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_pending_requests():
    """Pending-cycle marks of earlier tests (the local-memory cache outlives them) are gone."""
    from django.core.cache import cache

    cache.clear()


def closed_port() -> int:
    """A local TCP port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead_cache():
    return FailOpenRedisCache(
        f"redis://127.0.0.1:{closed_port()}/0",
        {"OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2}},
    )


def test_a_cache_without_redis_answers_as_empty(dead_cache, caplog):
    with caplog.at_level(logging.WARNING, logger="topoweb.cache"):
        assert dead_cache.get("k", "fallback") == "fallback"
        assert dead_cache.add("k", 1, 5) is True
        dead_cache.set("k", [1, 2], 5)
        with pytest.raises(ValueError):
            dead_cache.incr("k")
        assert dead_cache.get_many(["a", "b"]) == {}
        assert dead_cache.set_many({"a": 1}, 5) == ["a"]
        assert dead_cache.delete("k") is False
        assert dead_cache.has_key("k") is False
        assert dead_cache.touch("k", 5) is False
        dead_cache.delete_many(["a"])


def test_the_cache_builds_one_redis_client_per_pool_not_one_per_call(dead_cache, monkeypatch):
    import redis

    built = []
    original = redis.Redis.__init__

    def counted(self, *args, **kwargs):
        built.append(kwargs.get("connection_pool"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counted)
    for _ in range(5):
        dead_cache.get("k")
        dead_cache.set("k", 1, 5)
        dead_cache.add("k", 1, 5)
    assert len(built) == 1 and built[0] is not None


def test_throttling_lets_requests_through_while_the_cache_is_down(case44, alice_api, dead_cache, monkeypatch):
    from rest_framework.throttling import SimpleRateThrottle

    monkeypatch.setattr(SimpleRateThrottle, "cache", dead_cache)
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "1/min", "submit": "1/min"})
    for i in range(3):
        response = alice_api.post("/api/v1/jobs/", small_spec(f"t{i}", 1), format="json")
        assert response.status_code == 201
    assert Job.objects.count() == 3


def test_a_broker_that_refuses_the_task_leaves_the_job_queued_for_beat(case44, alice, monkeypatch, caplog):
    def refuse(cluster_id):
        raise BrokerUnavailable("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(cycle, "coalescing", lambda: True)
    monkeypatch.setattr(tasks.schedule_cluster_task, "delay", refuse)
    with caplog.at_level(logging.WARNING, logger="apps.scheduling.cycle"):
        assert cycle.request_cycle(case44.pk) is False
    assert "could not queue a cycle" in caplog.text
    # The pending mark was withdrawn: the next request (beat's or a submission's) queues.
    sent = []
    monkeypatch.setattr(tasks.schedule_cluster_task, "delay", lambda cluster_id: sent.append(cluster_id))
    assert cycle.request_cycle(case44.pk) is True and sent == [case44.pk]


def test_submission_is_stored_when_the_broker_is_down(
    case44, alice_api, monkeypatch, django_capture_on_commit_callbacks
):
    def refuse(cluster_id):
        raise BrokerUnavailable("Connection refused.")

    monkeypatch.setattr(tasks.schedule_cluster_task, "delay", refuse)
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_api.post("/api/v1/jobs/", small_spec("kept", 8), format="json")
    assert response.status_code == 201
    job = Job.objects.get(name="kept")
    assert job.status == JobStatus.QUEUED
    # Beat's tick when the broker is back runs the cycle that places it.
    monkeypatch.undo()
    tasks.schedule_all_clusters_task()
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING


def test_beat_is_not_absorbed_by_a_pending_request(case44, monkeypatch):
    sent = []
    monkeypatch.setattr(cycle, "coalescing", lambda: True)
    monkeypatch.setattr(tasks.schedule_cluster_task, "delay", lambda cluster_id: sent.append(cluster_id))
    assert cycle.request_cycle(case44.pk) is True
    # The worker that took this request died: the pending mark stays until its TTL.
    assert cycle.request_cycle(case44.pk) is False
    assert tasks.schedule_all_clusters_task() == 1
    assert sent == [case44.pk, case44.pk]
    assert cycle.PENDING_TTL_S <= 5


def run_delivered(cluster_id: int, *, redelivered: bool):
    """Run the cycle task as a worker runs a message the broker marked (or not) redelivered."""
    task = tasks.schedule_cluster_task
    task.push_request(delivery_info={"redelivered": redelivered})
    try:
        return task.run(cluster_id)
    finally:
        task.pop_request()


def test_a_redelivered_cycle_leaves_a_failed_record_then_runs(case44, alice):
    job = services.job_submit(user=alice, spec=small_spec("waits", 8))
    cycle_id = run_delivered(case44.pk, redelivered=True)
    lost, ran = SchedulingCycle.objects.filter(cluster=case44).order_by("id")
    assert lost.status == CycleStatus.FAILED and lost.error.startswith("WorkerLost:")
    assert ran.status == CycleStatus.COMPLETED and cycle_id == ran.pk
    assert ran.placed_jobs == [job.pk]


def test_a_cycle_that_keeps_killing_its_worker_is_left_to_beat(case44, alice):
    job = services.job_submit(user=alice, spec=small_spec("waits", 8))
    for _ in range(cycle.LOST_RETRY_LIMIT):
        assert run_delivered(case44.pk, redelivered=True) is not None
        job.refresh_from_db()
        services.job_cancel(job=job)
        job = services.job_submit(user=alice, spec=small_spec("waits", 8))
    assert run_delivered(case44.pk, redelivered=True) is None
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    last = SchedulingCycle.objects.filter(cluster=case44).order_by("-id").first()
    assert last.status == CycleStatus.FAILED and "beat retries" in last.error
    # Beat's own request is a first delivery: it runs.
    assert run_delivered(case44.pk, redelivered=False) is not None
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING


def test_a_first_delivery_leaves_no_failed_record(case44):
    run_delivered(case44.pk, redelivered=False)
    assert list(SchedulingCycle.objects.values_list("status", flat=True)) == [CycleStatus.COMPLETED]


@pytest.fixture
def cut_database(monkeypatch):
    """Call it to make every query on the default connection fail as a refused connection does."""
    from django.db.backends.utils import CursorWrapper

    def refuse(*args, **kwargs):
        raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')

    def cut():
        monkeypatch.setattr(CursorWrapper, "execute", refuse)
        monkeypatch.setattr(CursorWrapper, "executemany", refuse)

    return cut


def test_the_api_answers_json_503_with_retry_after_while_the_database_is_down(alice_api, cut_database):
    cut_database()
    for method, path in (("get", "/api/v1/jobs/"), ("post", "/api/v1/jobs/"), ("get", "/api/v1/clusters/")):
        body = small_spec("x", 1) if method == "post" else None
        response = getattr(alice_api, method)(path, body, format="json")
        assert response.status_code == 503, path
        assert response["Content-Type"] == "application/json"
        assert int(response["Retry-After"]) > 0
        assert "database is unavailable" in response.json()["detail"]


def test_pages_answer_a_plain_503_while_the_database_is_down(alice, case44, cut_database):
    client = Client()
    client.force_login(alice)
    cut_database()
    for response in (
        client.get("/queue/"),
        Client().post("/accounts/login/", {"username": "a", "password": "b"}),
    ):
        assert response.status_code == 503
        assert response["Content-Type"].startswith("text/html")
        assert b"briefly unavailable" in response.content and int(response["Retry-After"]) > 0


def test_other_database_errors_are_not_turned_into_503s(rf):
    from django.db import IntegrityError

    from topoweb.middleware import DatabaseUnavailableMiddleware

    middleware = DatabaseUnavailableMiddleware(lambda request: None)
    assert middleware.process_exception(rf.get("/api/v1/jobs/"), IntegrityError("duplicate")) is None


def test_counted_windows_without_redis_are_each_one(dead_cache):
    assert dead_cache.count_windows([("a", 60), ("b", 5)]) == [1, 1]

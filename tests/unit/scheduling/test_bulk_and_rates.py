"""Bulk submission (all or nothing, bounded) and the operators' own submission rate."""

from __future__ import annotations

import pytest
from rest_framework.throttling import SimpleRateThrottle

from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Job

from .conftest import small_spec, token_client

pytestmark = pytest.mark.django_db


def test_a_bulk_submission_queues_every_job(case44, alice_api):
    specs = [small_spec(f"b{i}", 2) for i in range(5)]
    response = alice_api.post("/api/v1/jobs/", specs, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["count"] == 5 and [j["name"] for j in body["results"]] == [f"b{i}" for i in range(5)]
    assert Job.objects.filter(status__in=[JobStatus.PLACING, JobStatus.QUEUED]).count() == 5


def test_one_bad_spec_refuses_the_whole_bulk_naming_its_place(case44, alice_api):
    bad = small_spec("bad", 1000)
    specs = [small_spec("ok", 2), bad, small_spec("greedy", 2, priority=10**6)]
    response = alice_api.post("/api/v1/jobs/", specs, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert "[1].gpus" in errors and "[2].priority" in errors
    assert not Job.objects.exists()


def test_a_bulk_is_bounded_in_count_and_bytes(case44, alice_api, settings):
    settings.BULK_MAX_JOBS = 3
    response = alice_api.post("/api/v1/jobs/", [small_spec(f"x{i}", 1) for i in range(4)], format="json")
    assert response.status_code == 400 and "1 to 3 job specs, got 4" in str(response.json())
    assert alice_api.post("/api/v1/jobs/", [], format="json").status_code == 400
    huge = [small_spec("h", 1, env={"PAD": "x" * 4000}) for _ in range(1100)]
    response = alice_api.post("/api/v1/jobs/", huge, format="json")
    assert response.status_code == 413 and response.json()["limit_bytes"] == 4 * 1024 * 1024
    # A single spec keeps its own, smaller limit.
    big = small_spec("big", 1, env={f"V{i}": "x" * 1000 for i in range(100)})
    response = alice_api.post("/api/v1/jobs/", big, format="json")
    assert response.status_code == 413 and response.json()["limit_bytes"] == 65536
    assert not Job.objects.exists()


def test_operators_past_the_users_rate_go_on_under_their_own(
    case44, alice_api, make_user, monkeypatch, throttle_window
):
    rates = {"submit": "2/min", "submit_operator": "4/min", "user": "1000/min"}
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", rates)
    operator = token_client(make_user("olga", role="operator"))
    post = lambda client, i: client.post("/api/v1/jobs/", small_spec(f"s{i}", 1), format="json").status_code  # noqa: E731
    assert [post(alice_api, i) for i in range(3)] == [201, 201, 429]
    assert [post(operator, i) for i in range(7)] == [201] * 6 + [429]

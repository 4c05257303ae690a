"""Idempotency-Key on job submission: a retried POST returns the first job, never a duplicate."""

from __future__ import annotations

import pytest
from django.db import IntegrityError

from apps.scheduling import services
from apps.scheduling.models import Job

from .conftest import small_spec

pytestmark = pytest.mark.django_db


def post(client, spec, key=None, **params):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
    return client.post(f"/api/v1/jobs/{query}", spec, format="json", **headers)


def test_a_retry_with_the_same_key_returns_the_first_job(case44, alice_api):
    first = post(alice_api, small_spec("once", 8), "retry-1")
    again = post(alice_api, small_spec("once", 8), "retry-1")
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"] and again["Location"] == first["Location"]
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Job.objects.count() == 1


def test_key_order_in_the_body_does_not_matter(case44, alice_api):
    spec = small_spec("once", 8)
    first = post(alice_api, spec, "k")
    again = post(alice_api, dict(reversed(list(spec.items()))), "k")
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]


def test_the_same_key_with_another_body_is_a_422_naming_the_header(case44, alice_api):
    first = post(alice_api, small_spec("once", 8), "k")
    other = post(alice_api, small_spec("twice", 8), "k")
    assert other.status_code == 422
    assert "Idempotency-Key" in other.json() and other.json()["job"] == first.json()["id"]
    other_cluster = post(alice_api, small_spec("once", 8), "k", cluster="case-4-4")
    assert other_cluster.status_code == 422
    assert Job.objects.count() == 1


def test_keys_are_per_user(case44, alice_api, bob_api):
    mine = post(alice_api, small_spec("same", 4), "shared")
    theirs = post(bob_api, small_spec("same", 4), "shared")
    assert theirs.status_code == 201 and theirs.json()["id"] != mine.json()["id"]
    assert "Idempotent-Replayed" not in theirs


def test_without_a_key_every_post_is_a_new_job(case44, alice_api):
    post(alice_api, small_spec("twin", 1))
    post(alice_api, small_spec("twin", 1))
    assert Job.objects.filter(name="twin").count() == 2


@pytest.mark.parametrize("key", ["", "has space", "x" * 129, "naïve", "tab\tkey"])
def test_malformed_keys_are_400s_naming_the_header(case44, alice_api, key):
    response = post(alice_api, small_spec("bad-key", 1), key)
    assert response.status_code == 400 and "Idempotency-Key" in response.json()
    assert not Job.objects.exists()


def test_a_rejected_spec_does_not_consume_the_key(case44, alice_api):
    bad = small_spec("bad", 1000)
    assert post(alice_api, bad, "k").status_code == 400
    assert post(alice_api, small_spec("good", 8), "k").status_code == 201


def test_a_concurrent_insert_of_the_same_key_returns_that_job(case44, alice, monkeypatch):
    spec = small_spec("raced", 8)
    real_submit = services.job_submit

    def lose_the_race(**kwargs):
        # The other request commits its job between our lookup and our insert.
        real_submit(**kwargs)
        raise IntegrityError("duplicate key value violates unique constraint")

    monkeypatch.setattr(services, "job_submit", lose_the_race)
    job, replayed = services.job_submit_once(user=alice, spec=spec, idempotency_key="race")
    assert replayed and job.name == "raced" and Job.objects.count() == 1


def test_the_database_refuses_a_second_job_with_the_same_owner_and_key(case44, alice):
    services.job_submit(user=alice, spec=small_spec("a", 1), idempotency=("k", "d"))
    with pytest.raises(IntegrityError):
        services.job_submit(user=alice, spec=small_spec("b", 1), idempotency=("k", "d"))

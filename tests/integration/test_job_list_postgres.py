"""A user's job list on Postgres: the page of their newest jobs is read from an index on
(owner, submitted_at, id), not sorted from every job of theirs, however many others have."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from apps.placement.topology import read_spec_file
from apps.scheduling.models import Job
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres"), pytest.mark.django_db]


def jobs(owner, cluster, n: int, start) -> list[Job]:
    return [
        Job(
            name=f"{owner.username}-{i}",
            cluster=cluster,
            owner=owner,
            spec={},
            gpus=1,
            status="completed",
            submitted_at=start + timedelta(seconds=i),
        )
        for i in range(n)
    ]


def test_a_users_newest_jobs_are_read_from_the_index_not_sorted():
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    users = get_user_model().objects
    me, other = users.create_user("me"), users.create_user("other")
    start = timezone.now() - timedelta(days=1)
    # Mine are older than most of the other user's, and a tenth as many.
    Job.objects.bulk_create(jobs(me, cluster, 400, start) + jobs(other, cluster, 4000, start))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduling_job")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=me).key}")
    with CaptureQueriesContext(connection) as ctx:
        response = client.get("/api/v1/jobs/?page_size=50")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 400
    assert [j["name"] for j in body["results"]] == [f"me-{i}" for i in range(399, 349, -1)]
    (page,) = [
        q["sql"] for q in ctx.captured_queries if '"scheduling_job"' in q["sql"] and "LIMIT" in q["sql"]
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {page}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "job_owner_submitted" in plan and "Sort" not in plan, plan

"""One user's job must never stop a cluster's scheduling: Postgres and a real Celery worker.

Jobs stored as submissions were before the physical ranges (runtime 1e18 s, a 400-digit count,
1.7e308 bytes per step) sit at the head of the queue; the worker's cycles mark them failed with the
reason and place the jobs submitted after them over REST. No cycle fails; every prediction is finite.
"""

from __future__ import annotations

import math

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.api.roles import role_grant
from apps.placement.topology import read_spec_file
from apps.scheduling.choices import CycleStatus, JobStatus
from apps.scheduling.models import Job, SchedulingCycle
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES, api_for, celery_workers, wait_for
from tests.unit.scheduling.conftest import small_spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres", "require_redis")]

POISONS = [
    {"estimated_runtime_s": 1e18},
    {"comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8, "count": 10**400}]},
    {"comm": [{"group": "dp", "collective": "volume", "bytes": 1.7e308}]},
]


@pytest.fixture
def worker(transactional_db, tmp_path):
    with celery_workers(1, tmp_path) as names:
        yield names


def test_poisoned_jobs_fail_alone_and_the_worker_places_the_others(worker):
    assert connection.vendor == "postgresql"
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    users = get_user_model().objects
    mallory, alice = users.create_user("mallory"), users.create_user("alice")
    poisoned = [
        Job.objects.create(
            name=f"poison-{i}",
            cluster=cluster,
            owner=mallory,
            spec={**small_spec(f"poison-{i}", 4, priority=100), **poison},
            priority=100,
            gpus=4,
            status=JobStatus.QUEUED,
        ).pk
        for i, poison in enumerate(POISONS)
    ]
    client = api_for(alice)
    good = []
    for i in range(3):
        response = client.post("/api/v1/jobs/", small_spec(f"good-{i}", 4), format="json")
        assert response.status_code == 201, response.content
        good.append(response.json()["id"])

    wait_for(
        lambda: Job.objects.filter(pk__in=good, status=JobStatus.PLACING).count() == len(good),
        what="the worker to place the good jobs",
    )
    for pk in poisoned:
        job = Job.objects.get(pk=pk)
        assert job.status == JobStatus.FAILED
        assert job.pending_reason.startswith("failed to schedule: its stored spec is invalid")
    recorded = {k for c in SchedulingCycle.objects.filter(cluster=cluster) for k in c.failed_jobs}
    assert recorded == {str(pk) for pk in poisoned}
    assert set(SchedulingCycle.objects.values_list("status", flat=True)) == {CycleStatus.COMPLETED}
    for row in Job.objects.values("predicted_comm_ms", "predicted_step_ms", "predicted_mfu"):
        assert all(v is None or math.isfinite(v) for v in row.values()), row
    assert client.get("/api/v1/jobs/").status_code == 200
    viewer = users.create_user("ops")
    role_grant(user=viewer, role="viewer")
    assert api_for(viewer).get("/api/v1/jobs/").json()["count"] == 6

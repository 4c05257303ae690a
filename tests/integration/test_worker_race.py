"""Four Celery workers race to schedule one cluster while 200 jobs are submitted and finished.

Every submission and every completion queues a cycle, so the workers contend for the cluster's
row lock all the time. Invariants, sampled throughout and checked at the end: no GPU ever has two
live allocations, every job is waiting, placed/running with exactly its GPUs, or finished with
none, and no cycle failed (a failure would mean the lock let two cycles book at once and the
unique constraint caught it).
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Q
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from apps.placement.topology import read_spec_file
from apps.scheduling import services
from apps.scheduling.choices import ACTIVE_STATUSES, CycleStatus, JobStatus
from apps.scheduling.models import Allocation, Job, SchedulingCycle
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES, celery_workers, wait_for
from topoweb.celery import app as celery_app

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres", "require_redis")]

JOBS = 200
WORKERS = 4
VALID = set(JobStatus.values)


def spec(i: int, rng: random.Random) -> dict:
    gpus = rng.choice([1, 2, 4, 8, 8, 16, 16, 32])
    return {
        "version": 1,
        "name": f"race-{i}",
        "cluster": "pod-256",
        "priority": rng.choice([0, 0, 0, 1, 5]),
        "gpus": gpus,
        "parallelism": {"tp": min(gpus, 8), "pp": 1, "dp": max(gpus // 8, 1)},
        "step": {"compute_ms": 100},
        "comm": [{"group": "tp", "collective": "allreduce", "bytes": 5e7}],
        "estimated_runtime_s": rng.choice([60, 600, 3600]),
    }


def violations() -> list[str]:
    """Everything wrong with the current committed state, as messages."""
    found = []
    doubled = Allocation.objects.filter(live=True).values("gpu_id").annotate(n=Count("id")).filter(n__gt=1)
    found += [f"GPU {row['gpu_id']} has {row['n']} live allocations" for row in doubled]
    rows = Job.objects.annotate(live=Count("allocations", filter=Q(allocations__live=True)))
    for job_id, status, gpus, live in rows.values_list("id", "status", "gpus", "live"):
        if status not in VALID:
            found.append(f"job {job_id} has status {status!r}")
        elif status in ACTIVE_STATUSES and live != gpus:
            found.append(f"job {job_id} is {status} with {live} of {gpus} GPUs")
        elif status not in ACTIVE_STATUSES and live:
            found.append(f"job {job_id} is {status} but holds {live} GPUs")
    return found


def launcher(stop: threading.Event, errors: list[str]) -> None:
    """Start placed jobs and complete running ones, as a cluster's launcher would."""
    try:
        while not stop.is_set():
            for job in Job.objects.filter(status=JobStatus.PLACING)[:50]:
                try:
                    services.job_start(job=job)
                except services.JobStateError:
                    pass
            for job in Job.objects.filter(status=JobStatus.RUNNING).order_by("started_at")[:20]:
                try:
                    services.job_complete(job=job)
                except services.JobStateError:
                    pass
            time.sleep(0.05)
    except Exception as exc:  # surfaced by the test, not swallowed
        errors.append(repr(exc))
    finally:
        connection.close()


def sampler(stop: threading.Event, seen: list[str]) -> None:
    try:
        while not stop.is_set():
            seen.extend(violations())
            time.sleep(0.1)
    finally:
        connection.close()


def test_four_workers_never_double_book(transactional_db, tmp_path, monkeypatch):
    # 200 submissions in seconds: lift the per-user submit throttle for this test only.
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"submit": "100000/min", "user": "100000/min"})
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "pod-256.yaml"))
    user = get_user_model().objects.create_user("racer")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    rng = random.Random(42)
    stop = threading.Event()
    errors: list[str] = []
    seen: list[str] = []
    with celery_workers(WORKERS, tmp_path) as names:
        threads = [
            threading.Thread(target=launcher, args=(stop, errors)),
            threading.Thread(target=sampler, args=(stop, seen)),
        ]
        for t in threads:
            t.start()
        try:
            for i in range(JOBS):
                response = client.post("/api/v1/jobs/", spec(i, rng), format="json")
                assert response.status_code == 201, response.content
            wait_for(
                lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == JOBS,
                timeout_s=60,
                what=f"all {JOBS} jobs to be placed, run and completed",
            )
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        stats = celery_app.control.inspect(destination=names, timeout=2.0).stats() or {}
    busy = [n for n, s in stats.items() if s.get("total", {}).get("scheduling.schedule_cluster", 0) > 0]
    assert len(busy) >= 2, f"expected several workers to run cycles, got {busy}"
    assert errors == []
    assert seen == []
    assert violations() == []
    assert SchedulingCycle.objects.filter(cluster=cluster, status=CycleStatus.FAILED).count() == 0
    placed = [j for ids in SchedulingCycle.objects.values_list("placed_jobs", flat=True) for j in ids]
    assert sorted(placed) == sorted(Job.objects.values_list("id", flat=True)), (
        "each job placed by one cycle, once"
    )
    counts = Job.objects.annotate(n=Count("allocations")).values_list("gpus", "n")
    assert all(gpus == n for gpus, n in counts), "every job ran on exactly its GPUs"

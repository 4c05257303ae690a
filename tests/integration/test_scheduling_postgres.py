"""The case 4.4 flow on the real Postgres with a real Celery worker process on the real Redis.

The worker is a subprocess started with the same settings and pointed at this test run's
database (DATABASE_URL naming the test database), consuming a queue of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from apps.placement.topology import read_spec_file
from apps.scheduling import services
from apps.scheduling.choices import CycleStatus, JobStatus
from apps.scheduling.models import Allocation, Job, SchedulingCycle
from apps.topology import services as topology_services
from topoweb.celery import app as celery_app

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres", "require_redis")]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
WORKER_START_TIMEOUT_S = 60


def this_runs_database_url() -> str:
    """DATABASE_URL of the database this test run uses (pytest-django's test database)."""
    s = connection.settings_dict
    auth = s["USER"] or ""
    if s["PASSWORD"]:
        auth += f":{s['PASSWORD']}"
    host = s["HOST"] or "127.0.0.1"
    port = s["PORT"] or "5432"
    return f"postgres://{auth}@{host}:{port}/{s['NAME']}"


@contextmanager
def celery_workers(count: int, log_dir: Path):
    """Start `count` worker processes (one task at a time each) on a fresh queue; route this
    process's tasks there; stop them on exit."""
    queue = f"topoweb-test-{uuid.uuid4().hex[:10]}"
    env = dict(os.environ, DATABASE_URL=this_runs_database_url(), TOPOWEB_TESTING="1")
    names = [f"w{i}-{queue}@localhost" for i in range(count)]
    procs = []
    logs = []
    before = celery_app.conf.task_default_queue
    try:
        for name in names:
            log = open(log_dir / f"{name.split('@')[0]}.log", "wb")
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "topoweb", "worker", "--pool", "solo"]
                    + ["-Q", queue, "-n", name, "--loglevel", "INFO", "--without-gossip", "--without-mingle"],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while True:
            replies = celery_app.control.ping(destination=names, timeout=1.0) or []
            if len(replies) == count:
                break
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                text = "\n".join((log_dir / f"{n.split('@')[0]}.log").read_text()[-2000:] for n in names)
                pytest.fail(f"celery workers did not start ({len(replies)}/{count} answered):\n{text}")
        celery_app.conf.task_default_queue = queue
        yield names
    finally:
        celery_app.conf.task_default_queue = before
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def wait_for(predicate, *, timeout_s: float = 30.0, what: str = "condition", explain=None):
    """Poll `predicate` every 50 ms until it returns something truthy; fail after `timeout_s`
    (with what `explain()` returns, when given: the state to look at)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}" + (f"\n{explain()}" if explain else ""))


def api_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def worker(transactional_db, tmp_path):
    with celery_workers(1, tmp_path) as names:
        yield names


def test_case44_flow_with_a_real_worker(worker):
    assert connection.vendor == "postgresql"
    assert not celery_app.conf.task_always_eager, "tasks must go through Redis to the worker"
    topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    users = get_user_model().objects
    alice = api_for(users.create_user("alice"))
    dave = api_for(users.create_user("dave"))
    staff = api_for(users.create_superuser("ops"))
    spec = read_spec_file(EXAMPLES / "case-4-4-job.yaml")

    first = alice.post("/api/v1/jobs/", spec, format="json")
    assert first.status_code == 201, first.content
    jid = first.json()["id"]
    wait_for(lambda: Job.objects.get(pk=jid).status == JobStatus.PLACING, what="the worker to place the job")
    ranks = alice.get(f"/api/v1/jobs/{jid}/placement/").json()["ranks"]
    nodes = [r["node"] for r in ranks]
    assert len(set(nodes[:8])) == 1 and len(set(nodes[8:])) == 1 and nodes[0] != nodes[8]
    rankfile = alice.get(f"/api/v1/jobs/{jid}/rankmap/", {"format": "openmpi"}).content.decode()
    lines = [line for line in rankfile.splitlines() if not line.startswith("#")]
    assert lines[8].startswith(f"-np 1 --host {nodes[8]} -x CUDA_VISIBLE_DEVICES=0 ")

    second = alice.post("/api/v1/jobs/", dict(spec, name="second"), format="json").json()["id"]
    reason = wait_for(lambda: Job.objects.get(pk=second).pending_reason, what="the second job's reason")
    assert reason.startswith("needs 16 GPUs, 0 free") and f"job {jid}" in reason
    assert staff.post(f"/api/v1/jobs/{jid}/start/").json()["status"] == "running"
    assert staff.post(f"/api/v1/jobs/{jid}/complete/").json()["status"] == "completed"
    wait_for(lambda: Job.objects.get(pk=second).status == JobStatus.PLACING, what="the second job to start")
    assert Allocation.objects.filter(job_id=second, live=True).count() == 16

    assert dave.get("/api/v1/jobs/").json()["count"] == 0
    assert dave.get(f"/api/v1/jobs/{jid}/").status_code == 404
    assert set(SchedulingCycle.objects.values_list("status", flat=True)) == {CycleStatus.COMPLETED}


@pytest.mark.django_db
def test_postgres_refuses_a_second_live_allocation_of_a_gpu():
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    user = get_user_model().objects.create_user("alice")
    spec = read_spec_file(EXAMPLES / "case-4-4-job.yaml")
    job = services.job_submit(user=user, spec=spec, cluster=cluster)
    services.schedule_cluster(cluster=cluster)
    gpu = Allocation.objects.filter(job=job, live=True).first().gpu
    other = Job.objects.create(
        name="x", cluster=cluster, owner=user, spec=job.spec, gpus=16, status="placing"
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(job=other, rank=0, gpu=gpu, live=True)

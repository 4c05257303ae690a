"""`/metrics`: TopoWeb's own state in Prometheus exposition, computed at scrape time in a bounded
number of queries, behind a bearer token or an address allow-list."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.metrics.models import JobSample
from apps.metrics.ops import REASON_NAMES, reason_class
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.demo import load_demo_jobs
from apps.scheduling.models import Allocation, Job, NodeHealth
from apps.scheduling.nodes import node_down
from apps.topology.models import Gpu, Node

pytestmark = pytest.mark.django_db


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def series(samples, name, **labels):
    want = set(labels.items())
    return {k[1]: v for k, v in samples.items() if k[0] == name and want <= set(k[1])}


def test_gpus_nodes_jobs_and_queue_add_up(client, case44, django_assert_max_num_queries):
    load_demo_jobs(start_all=True)
    total = Gpu.objects.filter(node__cluster=case44).count()
    placed = Allocation.objects.filter(live=True, job__cluster=case44).count()
    assert placed > 0
    with django_assert_max_num_queries(14):
        m = scrape(client)
    gpus = series(m, "topoweb_gpus", cluster="case-4-4")
    assert sum(gpus.values()) == total and gpus[(("cluster", "case-4-4"), ("state", "placed"))] == placed
    jobs = series(m, "topoweb_jobs", cluster="case-4-4")
    assert sum(jobs.values()) == Job.objects.filter(cluster=case44).count()
    assert len(series(m, "topoweb_queue_jobs", cluster="case-4-4")) == len(REASON_NAMES)

    # A node taken down: its unplaced GPUs are unavailable, the node counts as down.
    node = Node.objects.filter(cluster=case44).order_by("name").last()
    node_down(node=node, reason="test")
    idle_there = Gpu.objects.filter(node=node).exclude(allocations__live=True).count()
    m = scrape(client)
    assert m[("topoweb_nodes", (("cluster", "case-4-4"), ("state", "down")))] == 1
    assert m[("topoweb_gpus", (("cluster", "case-4-4"), ("state", "unavailable")))] == idle_there
    assert sum(series(m, "topoweb_gpus", cluster="case-4-4").values()) == total


def test_booked_without_rank_agents_behind_unhealthy_and_step_gap(client, case44, settings):
    load_demo_jobs(start_all=True)
    job = Job.objects.filter(cluster=case44, status=JobStatus.RUNNING).first()
    live = Allocation.objects.filter(job=job, live=True).count()
    # A job that ended while its GPUs stayed booked (no rank runs): nothing will release them.
    Job.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    old = timezone.now() - timedelta(seconds=settings.TOPOWEB_AGENT_DOWN_AFTER_S)
    first, second = Node.objects.filter(cluster=case44).order_by("name")[:2]
    NodeHealth.objects.create(node=first, state=NodeState.UP, last_seen=old)
    NodeHealth.objects.create(
        node=second,
        state=NodeState.UP,
        last_seen=timezone.now(),
        unhealthy_gpus=[{"gpu": 0, "reason": "xid 79"}],
    )
    m = scrape(client)
    assert m[("topoweb_gpus_booked_without_rank", (("cluster", "case-4-4"),))] == live
    assert m[("topoweb_agents_behind", (("cluster", "case-4-4"),))] == 1
    gpu0_placed = Allocation.objects.filter(live=True, gpu__node=second, gpu__index=0).exists()
    assert m[("topoweb_gpus", (("cluster", "case-4-4"), ("state", "unhealthy")))] == (0 if gpu0_placed else 1)

    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    JobSample.objects.create(job=job, at=timezone.now(), step_ms=300.0, predicted_step_ms=100.0)
    m = scrape(client)
    assert m[("topoweb_step_time_ratio_max", (("cluster", "case-4-4"),))] == pytest.approx(3.0)
    assert m[
        ("topoweb_job_step_time_ratio", (("cluster", "case-4-4"), ("job", str(job.pk))))
    ] == pytest.approx(3.0)


def test_token_or_allowed_addresses(client, case44, settings):
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    settings.TOPOWEB_METRICS_TOKEN = "s3cret-token-of-32-characters-xx"
    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = client.get(
        "/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.TOPOWEB_METRICS_TOKEN}", REMOTE_ADDR="10.1.2.3"
    )
    assert ok.status_code == 200 and b"topoweb_gpus{" in ok.content
    assert client.post("/metrics").status_code == 405


def test_pending_reasons_fall_in_bounded_classes():
    assert reason_class("account research holds 8 of its limit of 8 running GPUs") == "account_limit"
    assert reason_class("waiting behind job 3 (priority 5) reserved to start at 2026-01-01") == "reservation"
    assert reason_class("preempting job 4: waiting for its ranks to exit") == "preempting"
    assert reason_class("") == "none" and reason_class("something new") == "other"

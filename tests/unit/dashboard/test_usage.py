"""Accounting: per finished job its wait, runtime, exit code and GPU-hours; usage per user over a
period as a page and as CSV; relative times in pending reasons."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from apps.dashboard.templatetags.dashboard import relative_times
from apps.dashboard.usage import job_accounting, usage_by_user
from apps.metrics.models import JobSample
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Allocation, Job, RankRun
from apps.topology.models import Node


def _finish(job, status, *, wait_s, run_s, ago_s=600):
    end = timezone.now() - timedelta(seconds=ago_s)
    start = end - timedelta(seconds=run_s)
    Job.objects.filter(pk=job.pk).update(
        status=status, submitted_at=start - timedelta(seconds=wait_s), started_at=start, finished_at=end
    )
    # Its GPUs were booked from its start to its end: what usage counts.
    Allocation.objects.filter(job=job).update(created_at=start, released_at=end, live=False)
    job.refresh_from_db()
    return job


def test_a_failed_job_has_its_first_failing_exit_code_and_gpu_hours(naive_case44):
    job = _finish(naive_case44, JobStatus.FAILED, wait_s=120, run_s=1800)
    node = Node.objects.filter(cluster=job.cluster).first()
    now = timezone.now()
    for rank, code, at in ((3, -9, now), (1, 7, now - timedelta(seconds=5)), (0, 0, now)):
        RankRun.objects.create(
            job=job,
            generation=job.generation,
            rank=rank,
            node=node,
            state="exited",
            exit_code=code,
            exited_at=at,
        )
    acct = job_accounting([job])[job.pk]
    assert acct["exit_code"] == 7  # the first to fail, not the one killed after it
    assert acct["wait_s"] == 120 and acct["runtime_s"] == 1800
    assert acct["gpu_hours"] == job.gpus * 0.5


def test_usage_per_user_over_a_period(people, naive_case44):
    job = _finish(naive_case44, JobStatus.COMPLETED, wait_s=60, run_s=3600)
    JobSample.objects.create(job=job, at=job.finished_at, mfu=0.4)
    JobSample.objects.create(job=job, at=job.finished_at, mfu=0.2)
    since = timezone.now() - timedelta(days=1)
    (row,) = usage_by_user(user=people["ops"], since=since, until=timezone.now())
    assert row["user"] == "alice" and row["jobs"] == 1 and row["completed"] == 1
    assert row["gpu_hours"] == job.gpus and row["mean_wait_s"] == 60
    assert abs(row["mean_mfu"] - 0.3) < 1e-9
    assert usage_by_user(user=people["bob"], since=since, until=timezone.now()) == []
    assert usage_by_user(user=people["ops"], since=since - timedelta(days=5), until=since) == []


def test_usage_page_and_csv(client, people, naive_case44):
    job = _finish(naive_case44, JobStatus.COMPLETED, wait_s=60, run_s=7200)
    client.force_login(people["ops"])
    html = client.get("/usage/?range=24h").content.decode()
    assert 'id="usage-rows"' in html and "<td>alice</td>" in html and f"{2.0 * job.gpus:.2f}" in html
    response = client.get("/usage/?range=24h&format=csv")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows[0]["user"] == "alice" and float(rows[0]["gpu_hours"]) == 2.0 * job.gpus
    bad = client.get("/usage/?range=1y&since=yesterday&cluster=nope")
    text = bad.content.decode()
    assert bad.status_code == 400 and "range: one of" in text and "since: a UTC date" in text
    assert "cluster: no cluster named" in text


def test_queue_history_shows_wait_runtime_exit_and_gpu_hours(client, people, naive_case44):
    _finish(naive_case44, JobStatus.COMPLETED, wait_s=90, run_s=5400)
    client.force_login(people["alice"])
    html = client.get("/queue/?range=24h").content.decode()
    assert ">Runtime</th>" in html and ">1.5 h</td>" in html and ">2 min</td>" in html
    assert f">{1.5 * naive_case44.gpus:.2f}</td>" in html


def test_pending_reasons_show_relative_times():
    soon = (datetime.now(UTC) + timedelta(hours=5, minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = relative_times(f"waiting behind job 3 (priority 5) reserved to start at {soon}")
    assert "reserved to start in 5.0 h (" in text and "Z" not in text.split("(")[-1]
    past = relative_times("seen at 2020-01-01T00:00:00Z")
    assert past.startswith("seen at ") and "d ago (01-01 00:00 UTC)" in past


def test_usage_per_account(client, people, naive_case44):
    from apps.scheduling.models import Account

    job = _finish(naive_case44, JobStatus.COMPLETED, wait_s=60, run_s=3600)
    Job.objects.filter(pk=job.pk).update(account=Account.objects.create(name="nlp"))
    (row,) = usage_by_user(
        user=people["ops"], since=timezone.now() - timedelta(days=1), until=timezone.now(), by="account"
    )
    assert row["user"] == "nlp" and row["gpu_hours"] == job.gpus
    client.force_login(people["ops"])
    html = client.get("/usage/?range=24h&by=account").content.decode()
    assert "Usage per account" in html and "<td>nlp</td>" in html
    rows = list(
        csv.DictReader(io.StringIO(client.get("/usage/?range=24h&by=account&format=csv").content.decode()))
    )
    assert rows[0]["account"] == "nlp"
    assert client.get("/usage/?by=team").status_code == 400

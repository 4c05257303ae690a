"""The queue's sortable columns and its time-range history of finished jobs."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils import timezone

from apps.scheduling.models import Job

from .conftest import job_spec, run_job


def job_order(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'<tr data-job="(\d+)"', html)]


def finished(cluster, owner, name, *, hours_ago: float, gpus=1):
    job = run_job(cluster, owner, job_spec(gpus, name=name))
    Job.objects.filter(pk=job.pk).update(
        status="completed", finished_at=timezone.now() - timedelta(hours=hours_ago)
    )
    from apps.scheduling.models import Allocation

    Allocation.objects.filter(job=job).update(live=False, released_at=timezone.now())
    return job


def test_sort_by_a_whitelisted_column_both_ways(client, people, case44_db):
    small = run_job(case44_db, people["alice"], job_spec(1, name="small"))
    big = run_job(case44_db, people["alice"], job_spec(4, name="big"))
    mid = run_job(case44_db, people["alice"], job_spec(2, name="mid"))
    client.force_login(people["alice"])
    up = client.get("/queue/?sort=gpus").content.decode()
    assert job_order(up) == [small.pk, mid.pk, big.pk]
    assert 'aria-sort="ascending" data-sort="gpus"' in up
    assert 'href="?sort=-gpus"' in up  # the header link toggles to descending
    down = client.get("/queue/?sort=-gpus").content.decode()
    assert job_order(down) == [big.pk, mid.pk, small.pk]
    assert 'aria-sort="descending" data-sort="gpus"' in down
    assert job_order(client.get("/queue/?sort=-job").content.decode()) == [mid.pk, big.pk, small.pk]


def test_unknown_sort_is_a_400_naming_the_field(client, people, case44_db):
    client.force_login(people["alice"])
    for bad in ("owner__password", "spec", "-", "gpus;drop"):
        response = client.get("/queue/", {"sort": bad})
        assert response.status_code == 400, bad
        assert "<code>sort</code>" in response.content.decode()


def test_history_presets_show_finished_jobs_in_range(client, people, case44_db):
    recent = finished(case44_db, people["alice"], "recent", hours_ago=0.5)
    yesterday = finished(case44_db, people["alice"], "yesterday", hours_ago=20)
    old = finished(case44_db, people["alice"], "last-week", hours_ago=24 * 5)
    ancient = finished(case44_db, people["alice"], "ancient", hours_ago=24 * 30)
    holder = run_job(case44_db, people["alice"], job_spec(16, name="holds-all"))
    waiting = run_job(case44_db, people["alice"], job_spec(8, name="waits"))
    assert (holder.status, waiting.status) == ("running", "queued")
    client.force_login(people["alice"])
    assert set(job_order(client.get("/queue/?range=1h").content.decode())) == {recent.pk}
    assert set(job_order(client.get("/queue/?range=24h").content.decode())) == {recent.pk, yesterday.pk}
    week = client.get("/queue/?range=7d&sort=-finished").content.decode()
    assert job_order(week) == [recent.pk, yesterday.pk, old.pk]
    # The default queue lists waiting and running jobs, not the history.
    assert set(job_order(client.get("/queue/").content.decode())) == {holder.pk, waiting.pk}
    since = (timezone.now() - timedelta(days=40)).strftime("%Y-%m-%dT%H:%M")
    until = (timezone.now() - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    custom = client.get("/queue/", {"since": since, "until": until}).content.decode()
    assert set(job_order(custom)) == {old.pk, ancient.pk}
    # Running jobs asked for stay listed beside the finished ones in range.
    both = client.get("/queue/?range=1h&status=queued&status=completed").content.decode()
    assert job_order(both) == [waiting.pk, recent.pk]  # not finished yet, then the last finished


def test_a_history_without_a_sort_column_lists_the_last_finished_first(client, people, case44_db):
    first = finished(case44_db, people["alice"], "submitted-first", hours_ago=10)
    second = finished(case44_db, people["alice"], "submitted-second", hours_ago=1)
    client.force_login(people["alice"])
    assert job_order(client.get("/queue/?range=24h").content.decode()) == [second.pk, first.pk]
    # Without a range the queue's order stays: priority, then oldest submitted first.
    assert job_order(client.get("/queue/?status=completed").content.decode()) == [first.pk, second.pk]


def test_history_bounds_are_checked(client, people, case44_db):
    client.force_login(people["alice"])
    now = timezone.now()
    cases = {
        "until": {
            "since": now.strftime("%Y-%m-%dT%H:%M"),
            "until": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
        },
        "since": {
            "since": (now - timedelta(days=400)).strftime("%Y-%m-%dT%H:%M"),
            "until": now.strftime("%Y-%m-%dT%H:%M"),
        },
        "range": {"range": "1h", "since": now.strftime("%Y-%m-%dT%H:%M")},
    }
    for field, params in cases.items():
        response = client.get("/queue/", params)
        assert response.status_code == 400 and f"<code>{field}</code>" in response.content.decode(), field
    assert client.get("/queue/?range=2y").status_code == 400
    for far in (
        "until=0001-01-01T00:00",
        "since=0001-01-01T00:00",
        "since=1999-12-31T23:59&until=2000-01-02T00:00",
    ):
        assert client.get(f"/queue/?{far}").status_code == 400, far
    a_year_ago = (now - timedelta(days=400)).strftime("%Y-%m-%dT%H:%M")
    assert b"<code>since</code>" in client.get("/queue/", {"since": a_year_ago}).content
    assert client.get("/queue/?since=yesterday").status_code == 400


def test_queue_links_each_visible_jobs_nodes(client, people, naive_case44):
    client.force_login(people["alice"])
    html = client.get("/queue/").content.decode()
    assert (
        'href="/clusters/case-4-4/nodes/node-a/"' in html
        and 'href="/clusters/case-4-4/nodes/node-b/"' in html
    )
    client.force_login(people["bob"])
    assert "/nodes/node-a/" not in client.get("/queue/").content.decode()

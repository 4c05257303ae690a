"""One source of GPU use: the usage page and API, the queue page's Accounts table and fair share
count the same GPU-seconds on the same replayed history (running jobs, jobs straddling the
period's edges, a requeued job's two generations)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.dashboard.usage import usage_by_user
from apps.placement.priority import Usage, decayed_gpu_seconds, fair_share_factors
from apps.scheduling import services
from apps.scheduling.accounts import accounts_use, cluster_accounts
from apps.scheduling.models import Account, AccountMembership, Allocation, Job
from apps.scheduling.usage import gpu_seconds

from .conftest import small_spec, token_client

pytestmark = pytest.mark.django_db
H = 3600.0


@pytest.fixture
def history(case44, alice, bob, staff, committed):
    """Replayed on case-4-4 (16 GPUs), hours before `now`:
    research (alice): `straddle` 8 GPUs from -30 to -20; `requeued` 4 GPUs from -10 to -9
    (generation 1), then from -5 on (generation 2, running).
    product (bob): `long` 4 GPUs from -50 on (running)."""
    research = Account.objects.create(name="research", share=3)
    product = Account.objects.create(name="product", share=1)
    AccountMembership.objects.create(user=alice, account=research)
    AccountMembership.objects.create(user=bob, account=product)
    straddle = committed(services.job_submit, user=alice, spec=small_spec("straddle", 8))
    committed(services.job_complete, job=straddle)
    requeued = committed(services.job_submit, user=alice, spec=small_spec("requeued", 4))
    long = committed(services.job_submit, user=bob, spec=small_spec("long", 4))
    now = timezone.now()
    at = lambda h: now - timedelta(hours=h)  # noqa: E731
    Allocation.objects.filter(job=straddle).update(created_at=at(30), released_at=at(20))
    Job.objects.filter(pk=straddle.pk).update(started_at=at(30), finished_at=at(20))
    Allocation.objects.filter(job=long).update(created_at=at(50), released_at=None)
    Allocation.objects.filter(job=requeued).update(created_at=at(5), generation=2)
    Allocation.objects.bulk_create(
        Allocation(job=requeued, rank=r, live=False, generation=1, created_at=at(10), released_at=at(9))
        for r in range(4)
    )
    return now, case44


def test_usage_page_accounts_table_and_fair_share_agree_to_the_gpu_second(history, staff, settings):
    now, cluster = history
    since = now - timedelta(hours=24)
    page = {
        r["user"]: r["gpu_seconds"]
        for r in usage_by_user(user=staff, since=since, until=now, cluster=cluster, by="account")
    }
    # Straddle: 8 GPUs × 4 h inside; requeued: 4 × 1 h + 4 × 5 h; long: 4 × 24 h.
    assert page == pytest.approx({"research": (32 + 24) * H, "product": 96 * H}, abs=1.0)
    table = {a["name"]: a["clusters"][0] for a in accounts_use(clusters=[cluster], now=now)}
    assert {n: c["gpu_hours_used"] * H for n, c in table.items()} == pytest.approx(page, abs=1.0)
    assert table["research"]["period_h"] == 24 and table["research"]["running_gpus"] == 4
    # Fair share reads the same rows: undecayed, the usage page's GPU-seconds since ever; its
    # factors are those of the replayed history decayed.
    ever = {
        r["user"]: r["gpu_seconds"]
        for r in usage_by_user(
            user=staff, since=now - timedelta(days=365), until=now, cluster=cluster, by="account"
        )
    }
    assert ever == pytest.approx({"research": (80 + 24) * H, "product": 200 * H}, abs=1.0)
    standing = cluster_accounts(cluster=cluster, now=now)
    ids = {a.name: pk for pk, a in standing.accounts.items()}
    undecayed = gpu_seconds(standing.usage, since=None, until=now)
    assert undecayed == pytest.approx({ids[n]: s for n, s in ever.items()}, abs=1.0)
    at = lambda h: now - timedelta(hours=h)  # noqa: E731
    r, p = ids["research"], ids["product"]
    replayed = [
        Usage(r, 8, at(30), at(20)),
        Usage(r, 4, at(10), at(9)),
        Usage(r, 4, at(5), None),
        Usage(p, 4, at(50), None),
    ]
    half_life_s = settings.FAIR_SHARE_HALF_LIFE_H * H
    expected = fair_share_factors(
        decayed_gpu_seconds(replayed, now=now, half_life_s=half_life_s), {r: 3, p: 1}
    )
    assert standing.factors == pytest.approx(expected, rel=1e-9)


def test_usage_per_user_and_cluster_and_own_jobs_only(history, alice, staff):
    now, cluster = history
    since = now - timedelta(hours=24)
    rows = {r["user"]: r for r in usage_by_user(user=staff, since=since, until=now, by="user")}
    assert rows["alice"]["gpu_seconds"] == pytest.approx(56 * H, abs=1.0)
    assert rows["alice"]["jobs"] == 2 and rows["alice"]["completed"] == 1  # straddle, finished at -20 h
    (whole,) = usage_by_user(user=staff, since=since, until=now, by="cluster")
    assert whole["user"] == "case-4-4" and whole["gpu_seconds"] == pytest.approx(152 * H, abs=1.0)
    assert [r["user"] for r in usage_by_user(user=alice, since=since, until=now)] == ["alice"]


def test_usage_api_bounds_and_permissions(history, alice, staff):
    now, _ = history
    start = (now - timedelta(hours=24)).isoformat()
    end = now.isoformat()
    ops = token_client(staff).get("/api/v1/usage/", {"start": start, "end": end, "by": "account"})
    assert ops.status_code == 200, ops.content
    got = {r["account"]: r["gpu_seconds"] for r in ops.json()["results"]}
    assert got == pytest.approx({"research": 56 * H, "product": 96 * H}, abs=1.0)
    own = token_client(alice).get("/api/v1/usage/", {"start": start, "end": end}).json()["results"]
    assert [r["user"] for r in own] == ["alice"]
    api = token_client(staff)
    for query, field in (
        ({"end": end}, "start"),
        ({"start": start, "end": "tomorrow"}, "end"),
        ({"start": end, "end": start}, "end"),
        ({"start": "2020-01-01T00:00Z", "end": end}, "end"),
        ({"start": start, "end": end, "by": "team"}, "by"),
        ({"start": start, "end": end, "cluster": "nope"}, "cluster"),
    ):
        bad = api.get("/api/v1/usage/", query)
        assert bad.status_code == 400 and field in bad.json(), (query, bad.content)
    assert APIClient().get("/api/v1/usage/", {"start": start, "end": end}).status_code in (401, 403)


def test_usage_csv_counts_a_running_job(client, history, staff):
    now, _ = history
    client.force_login(staff)
    text = client.get("/usage.csv", {"by": "account", "range": "24h"}).content.decode()
    header, *rows = text.strip().splitlines()
    assert header.startswith("account,jobs,completed,failed,cancelled,gpu_seconds,gpu_hours")
    product = next(r for r in rows if r.startswith("product,"))
    assert float(product.split(",")[5]) >= 96 * H - 1.0

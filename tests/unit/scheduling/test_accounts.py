"""Accounts: running-GPU and GPU-hour limits, borrowing and reclaim, priority limits, fair share."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.scheduling import services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Account, AccountLimit, AccountMembership, Allocation, Job

from .conftest import small_spec, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def teams(case44, alice, bob):
    """Account research (alice, share 3) and product (bob, share 1), each limited to 8 GPUs."""
    research = Account.objects.create(name="research", share=3)
    product = Account.objects.create(name="product", share=1)
    AccountMembership.objects.create(user=alice, account=research)
    AccountMembership.objects.create(user=bob, account=product)
    for account in (research, product):
        AccountLimit.objects.create(account=account, cluster=case44, max_running_gpus=8)
    return research, product


def test_a_job_over_its_accounts_running_limit_waits_with_that_reason(teams, alice, committed):
    first = committed(services.job_submit, user=alice, spec=small_spec("first", 8))
    second = committed(services.job_submit, user=alice, spec=small_spec("second", 4))
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == JobStatus.PLACING and first.account.name == "research"
    assert second.status == JobStatus.QUEUED
    assert second.pending_reason == (
        "account research holds 8 of its limit of 8 running GPUs; this job's 4 would exceed it"
    )
    # Eight GPUs stay idle: the limit, not the cluster, holds it back.
    assert Allocation.objects.filter(live=True).count() == 8
    committed(services.job_complete, job=first)
    second.refresh_from_db()
    assert second.status == JobStatus.PLACING


def test_a_spent_gpu_hour_budget_holds_jobs_until_the_period_moves_on(teams, case44, alice, committed):
    research, _ = teams
    AccountLimit.objects.filter(account=research).update(gpu_hours_per_period=20, period_h=24)
    old = committed(services.job_submit, user=alice, spec=small_spec("old", 8))
    committed(services.job_complete, job=old)
    # Eight GPUs for three hours, ten hours ago: 24 GPU-hours of the 20 allowed.
    ago = timezone.now() - timedelta(hours=10)
    Allocation.objects.filter(job=old).update(created_at=ago - timedelta(hours=3), released_at=ago)
    new = committed(services.job_submit, user=alice, spec=small_spec("new", 4))
    new.refresh_from_db()
    assert new.status == JobStatus.QUEUED
    assert new.pending_reason.startswith(
        "account research has used 24.0 of its 20 GPU-hours in the last 24 h"
    )
    AccountLimit.objects.filter(account=research).update(period_h=6)
    services.schedule_cluster(cluster=case44)
    new.refresh_from_db()
    assert new.status == JobStatus.PLACING


def test_borrowed_capacity_is_reclaimed_even_with_preemption_off(teams, case44, alice, bob, committed):
    research, product = teams
    assert not case44.preemption_enabled
    AccountLimit.objects.filter(account=product).update(may_borrow=True)
    own = committed(services.job_submit, user=bob, spec=small_spec("own", 8, priority=50))
    lent = committed(services.job_submit, user=bob, spec=small_spec("lent", 8, priority=50))
    own.refresh_from_db()
    lent.refresh_from_db()
    assert own.status == lent.status == JobStatus.PLACING
    assert (own.borrowed, lent.borrowed) == (False, True)
    # A third job of product finds no idle GPUs and neither preempts nor reserves.
    third = committed(services.job_submit, user=bob, spec=small_spec("third", 4, priority=50))
    third.refresh_from_db()
    assert third.status == JobStatus.QUEUED
    assert "it may borrow idle GPUs, but does not fit on them" in third.pending_reason
    # Research, within its limit and at a lower priority, takes its GPUs back from the borrower.
    mine = committed(services.job_submit, user=alice, spec=small_spec("mine", 8, priority=0))
    mine.refresh_from_db()
    lent.refresh_from_db()
    own.refresh_from_db()
    assert mine.status == JobStatus.PLACING
    assert lent.status == JobStatus.PREEMPTED
    assert lent.requeue_reason == f"reclaimed by job {mine.pk} of account research: it ran on borrowed GPUs"
    assert own.status == JobStatus.PLACING


def test_without_borrowing_no_job_of_the_account_is_reclaimed(teams, case44, alice, bob, committed):
    # Jobs within their limits are never reclaimed: product's 8 GPUs are its own.
    committed(services.job_submit, user=bob, spec=small_spec("own", 8))
    committed(services.job_submit, user=alice, spec=small_spec("a", 8))
    extra = committed(services.job_submit, user=alice, spec=small_spec("b", 8))
    extra.refresh_from_db()
    assert extra.status == JobStatus.QUEUED
    assert Job.objects.filter(status=JobStatus.PREEMPTED).count() == 0


def test_priority_over_the_limit_is_refused_naming_the_field_and_limit(teams, alice, make_user):
    response = token_client(alice).post(
        "/api/v1/jobs/", small_spec("greedy", 4, priority=1000000), format="json"
    )
    assert response.status_code == 400
    assert response.json()["priority"] == ["1000000 is over the limit of 100 for account research"]
    assert not Job.objects.exists()
    # Saved as the admin saves it: the process forgets the remembered token's account at once
    # (a bare UPDATE from elsewhere reaches it within USER_TOKEN_CACHE_S, see test_api_roles).
    research = Account.objects.get(name="research")
    research.max_priority = 5
    research.save()
    response = token_client(alice).post("/api/v1/jobs/", small_spec("six", 4, priority=6), format="json")
    assert response.json()["priority"] == ["6 is over the limit of 5 for account research"]
    loner = make_user("loner")
    response = token_client(loner).post("/api/v1/jobs/", small_spec("x", 4, priority=101), format="json")
    assert response.json()["priority"] == ["101 is over the limit of 100 for your role"]
    operator = make_user("ops", role="operator")
    response = token_client(operator).post(
        "/api/v1/jobs/", small_spec("urgent", 4, priority=5000), format="json"
    )
    assert response.status_code == 201, response.content


def test_the_account_that_used_less_than_its_share_goes_first(teams, case44, alice, bob, committed):
    research, product = teams
    AccountLimit.objects.all().delete()
    # Research (share 3) used 16 GPUs for 6 hours just now; product (share 1) nothing.
    past = committed(services.job_submit, user=alice, spec=small_spec("past", 16))
    committed(services.job_complete, job=past)
    now = timezone.now()
    Allocation.objects.filter(job=past).update(created_at=now - timedelta(hours=6), released_at=now)
    blocker = committed(services.job_submit, user=alice, spec=small_spec("blocker", 16))
    # Research submits first and asks for more; product's job still goes first.
    r = committed(services.job_submit, user=alice, spec=small_spec("r", 16, priority=20))
    p = committed(services.job_submit, user=bob, spec=small_spec("p", 16, priority=0))
    body_r = token_client(alice).get(f"/api/v1/jobs/{r.pk}/priority/").json()
    body_p = token_client(bob).get(f"/api/v1/jobs/{p.pk}/priority/").json()
    assert body_p["factors"]["fair_share"] == 1.0
    assert body_r["factors"]["fair_share"] < 0.5
    assert body_p["effective"] > body_r["effective"]
    for body in (body_r, body_p):
        assert body["effective"] == pytest.approx(sum(body["terms"].values()), abs=1e-5)
    committed(services.job_complete, job=blocker)
    p.refresh_from_db()
    r.refresh_from_db()
    assert (p.status, r.status) == (JobStatus.PLACING, JobStatus.QUEUED)


def test_accounts_api_shows_use_against_limits(teams, case44, alice, bob, committed):
    committed(services.job_submit, user=alice, spec=small_spec("a", 4))
    body = token_client(bob).get("/api/v1/accounts/").json()["results"]
    by_name = {a["name"]: a for a in body}
    assert set(by_name) == {"product", "research"}
    assert by_name["research"]["members"] == ["alice"] and by_name["research"]["share"] == 3
    [use] = by_name["research"]["clusters"]
    assert (use["cluster"], use["running_gpus"], use["max_running_gpus"]) == ("case-4-4", 4, 8)
    assert by_name["product"]["clusters"][0]["running_gpus"] == 0


def test_queue_page_lists_accounts_and_job_page_shows_priority_terms(teams, alice, client, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("a", 4, priority=7))
    client.force_login(alice)
    page = client.get("/queue/").content.decode()
    assert 'id="accounts"' in page and "research" in page and "4 of 8" in page
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="effective-priority"' in page
    assert "requested 7.00" in page and "account research" in page

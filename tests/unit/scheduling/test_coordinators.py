"""Account coordinators (Slurm's): an operator scoped to one account's jobs, who holds, releases,
requeues, re-prioritises and cancels them and chooses which of the account's QOS each member may
use; cluster-wide actions stay with operators (the permission matrix covers every route)."""

from __future__ import annotations

import pytest

from apps.api.roles import role_grant
from apps.scheduling import services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Account, AccountMembership, Job, Qos

from .conftest import small_spec, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def research(case44, alice, make_user):
    """Account research: alice a member, carol its coordinator; it may use normal and high."""
    account = Account.objects.create(name="research", max_priority=50)
    AccountMembership.objects.create(user=alice, account=account, is_default=True)
    carol = make_user("carol")
    AccountMembership.objects.create(user=carol, account=account, is_coordinator=True)
    high = Qos.objects.create(cluster=case44, name="high", priority=50)
    account.qos.add(Qos.objects.get(cluster=case44, name="normal"), high)
    return account, carol, high


def reloaded(job: Job) -> Job:
    job.refresh_from_db()
    return job


def test_a_held_job_waits_until_its_coordinator_releases_it(research, alice, committed):
    _, carol, _ = research
    api = token_client(carol)
    blocker = committed(services.job_submit, user=alice, spec=small_spec("all", 16))
    job = committed(services.job_submit, user=alice, spec=small_spec("next", 8))
    assert reloaded(job).status == JobStatus.QUEUED
    held = api.post(f"/api/v1/jobs/{job.pk}/hold/")
    assert held.status_code == 200, held.content
    assert held.json()["held"] is True and held.json()["pending_reason"].startswith("held by carol")
    # GPUs free up, but a held job is not placed: the cycle does not walk it.
    committed(services.job_cancel, job=blocker)
    assert reloaded(job).status == JobStatus.QUEUED and reloaded(job).held
    assert api.post(f"/api/v1/jobs/{job.pk}/hold/").status_code == 200  # holding again: no change
    with pytest.raises(services.JobStateError):
        services.job_hold(job=blocker, user=carol)  # cancelled: nothing to hold
    released = committed(token_client(carol).post, f"/api/v1/jobs/{job.pk}/release/")
    assert released.status_code == 200, released.content
    assert reloaded(job).status == JobStatus.PLACING and not reloaded(job).held
    again = api.post(f"/api/v1/jobs/{job.pk}/release/")
    assert again.status_code == 409 and "release needs status held" in again.json()["detail"]


def test_a_held_job_still_counts_against_the_queued_cap(research, alice, committed, settings):
    settings.MAX_QUEUED_PER_USER = 2
    committed(services.job_submit, user=alice, spec=small_spec("all", 16))
    waiting = committed(services.job_submit, user=alice, spec=small_spec("w", 8))
    services.job_hold(job=waiting, user=research[1])
    committed(services.job_submit, user=alice, spec=small_spec("w2", 8))
    with pytest.raises(services.QueuedCapExceeded):
        services.job_submit(user=alice, spec=small_spec("w3", 8))


def test_a_coordinator_requeues_and_reprioritises_their_accounts_jobs(research, alice, committed):
    account, carol, _ = research
    api = token_client(carol)
    running = committed(services.job_submit, user=alice, spec=small_spec("r", 8))
    committed(services.job_start, job=running)
    requeued = committed(api.post, f"/api/v1/jobs/{running.pk}/requeue/")
    assert requeued.status_code == 200, requeued.content
    job = reloaded(running)
    assert job.requeues == 1 and job.requeue_reason == "by carol"
    # Within the account's max_priority (50): carol is no operator.
    waiting = committed(services.job_submit, user=alice, spec=small_spec("w", 16))
    ok = api.post(f"/api/v1/jobs/{waiting.pk}/priority/", {"priority": 40}, format="json")
    assert ok.status_code == 200 and ok.json()["factors"]["requested"] == 40
    assert reloaded(waiting).priority == 40
    over = api.post(f"/api/v1/jobs/{waiting.pk}/priority/", {"priority": 51}, format="json")
    assert (
        over.status_code == 400 and "over the limit of 50 for account research" in over.json()["priority"][0]
    )
    bad = api.post(f"/api/v1/jobs/{waiting.pk}/priority/", {"priority": 10**9}, format="json")
    assert bad.status_code == 400 and "priority" in bad.json()
    assert reloaded(waiting).priority == 40
    committed(services.job_cancel, job=waiting)
    finished = api.post(f"/api/v1/jobs/{waiting.pk}/priority/", {"priority": 1}, format="json")
    assert finished.status_code == 409


def test_a_coordinator_is_a_stranger_to_other_accounts_and_to_cluster_settings(
    research, bob, make_user, case44, committed
):
    _, carol, _ = research
    elsewhere = Account.objects.create(name="elsewhere")
    AccountMembership.objects.create(user=bob, account=elsewhere, is_default=True)
    theirs = committed(services.job_submit, user=bob, spec=small_spec("b", 16))
    api = token_client(carol)
    assert api.post(f"/api/v1/jobs/{theirs.pk}/hold/").status_code == 404
    assert api.post(f"/api/v1/jobs/{theirs.pk}/cancel/").status_code == 404
    assert api.patch(f"/api/v1/clusters/{case44.pk}/", {"policy": "naive"}, format="json").status_code == 403
    qos = Qos.objects.get(cluster=case44, name="normal")
    assert api.patch(f"/api/v1/qos/{qos.pk}/", {"priority": 9}, format="json").status_code == 403
    # A coordinator of no account's jobs is any user: the operator role is what acts cluster-wide.
    dave = make_user("dave")
    role_grant(user=dave, role="operator")
    assert token_client(dave).post(f"/api/v1/jobs/{theirs.pk}/cancel/").status_code == 200


def test_a_coordinator_sees_their_accounts_jobs_in_the_api_and_on_the_dashboard(
    research, alice, bob, committed, client
):
    _, carol, _ = research
    mine = committed(services.job_submit, user=alice, spec=small_spec("a", 2))
    other = committed(services.job_submit, user=bob, spec=small_spec("b", 2))
    listed = {j["id"] for j in token_client(carol).get("/api/v1/jobs/").json()["results"]}
    assert listed == {mine.pk}
    client.force_login(carol)
    assert client.get(f"/jobs/{mine.pk}/").status_code == 200
    assert client.get(f"/jobs/{other.pk}/").status_code == 404
    queue = client.get("/queue/").content.decode()
    assert f"job {mine.pk} · a (alice)" in queue


def test_the_job_list_selects_by_owner_and_by_the_coordinated_accounts_ids_not_a_subquery(
    research, alice, bob, committed
):
    """A member's list is `owner = me` alone (an index scan of their jobs); a coordinator's names
    the accounts' ids: neither reads the memberships inside the jobs' query, which scanned every
    job of the table."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    account, carol, _ = research
    alice_job = committed(services.job_submit, user=alice, spec=small_spec("a", 2))
    committed(services.job_submit, user=bob, spec=small_spec("b", 2))
    for user, expected in (alice, {alice_job.pk}), (carol, {alice_job.pk}), (bob, None):
        with CaptureQueriesContext(connection) as ctx:
            page = token_client(user).get("/api/v1/jobs/").json()
        if expected is not None:
            assert {j["id"] for j in page["results"]} == expected, user
        jobs_queries = [q["sql"] for q in ctx.captured_queries if 'FROM "scheduling_job"' in q["sql"]]
        assert jobs_queries and not any("scheduling_accountmembership" in q for q in jobs_queries), user
        names_account = any(f'"account_id" IN ({account.pk})' in q for q in jobs_queries)
        assert names_account == (user == carol), user
    # The coordinated accounts are remembered with carol's token, and forgotten with it once her
    # membership changes.
    AccountMembership.objects.filter(user=carol, account=account).delete()
    assert token_client(carol).get("/api/v1/jobs/").json()["results"] == []


def test_a_coordinator_chooses_which_of_the_accounts_qos_a_member_may_use(research, alice, case44, committed):
    account, carol, high = research
    membership = AccountMembership.objects.get(user=alice, account=account)
    api = token_client(carol)
    normal = Qos.objects.get(cluster=case44, name="normal")
    # Only the account's QOS: a coordinator cannot widen what the account may use.
    outside = Qos.objects.create(cluster=case44, name="outside", priority=1000)
    refused = api.patch(f"/api/v1/memberships/{membership.pk}/", {"qos": [outside.pk]}, format="json")
    assert refused.status_code == 400 and "may not use outside" in refused.json()["qos"][0]
    done = api.patch(f"/api/v1/memberships/{membership.pk}/", {"qos": [normal.pk]}, format="json")
    assert done.status_code == 200, done.content
    assert done.json()["qos_names"] == ["case-4-4/normal"]
    response = token_client(alice).post("/api/v1/jobs/", small_spec("h", 2, qos="high"), format="json")
    assert response.status_code == 400
    assert "may not use QOS 'high'" in response.json()["qos"][0] and "for alice" in response.json()["qos"][0]
    assert committed(services.job_submit, user=alice, spec=small_spec("n", 2)).qos == normal
    # Emptied again: every QOS of the account.
    api.patch(f"/api/v1/memberships/{membership.pk}/", {"qos": []}, format="json")
    assert committed(services.job_submit, user=alice, spec=small_spec("h", 2, qos="high")).qos == high
    # Alice reads her membership but may not change it.
    assert token_client(alice).get(f"/api/v1/memberships/{membership.pk}/").status_code == 200
    assert (
        token_client(alice)
        .patch(f"/api/v1/memberships/{membership.pk}/", {"qos": []}, format="json")
        .status_code
        == 403
    )


def test_the_job_page_lets_a_coordinator_hold_reprioritise_and_cancel(
    research, alice, bob, committed, client
):
    _, carol, _ = research
    committed(services.job_submit, user=alice, spec=small_spec("all", 16))
    job = committed(services.job_submit, user=alice, spec=small_spec("w", 8))
    client.force_login(carol)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'action="/jobs/{job.pk}/hold/"' in page and f'action="/jobs/{job.pk}/priority/"' in page
    assert client.post(f"/jobs/{job.pk}/hold/").status_code == 302
    assert reloaded(job).held
    assert f'action="/jobs/{job.pk}/release/"' in client.get(f"/jobs/{job.pk}/").content.decode()
    assert client.post(f"/jobs/{job.pk}/priority/", {"priority": "30"}).status_code == 302
    assert reloaded(job).priority == 30
    assert client.post(f"/jobs/{job.pk}/priority/", {"priority": "1e9"}).status_code == 400
    over = client.post(f"/jobs/{job.pk}/priority/", {"priority": "60"}, follow=True)
    assert "over the limit of 50 for account research" in over.content.decode()
    assert reloaded(job).priority == 30
    # The owner may cancel but not hold; another user does not see the job.
    client.force_login(alice)
    assert client.post(f"/jobs/{job.pk}/hold/").status_code == 403
    assert f'action="/jobs/{job.pk}/hold/"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    client.force_login(bob)
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    client.force_login(carol)
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 302
    assert reloaded(job).status == JobStatus.CANCELLED and not reloaded(job).held

"""QOS (Slurm's quality of service) and accounts enforced: one test per limit (docs/accounts.md's
table), the QOS priority term, borrowing and preemptible QOS, several accounts per user, a job
naming its account and QOS, TOPOWEB_REQUIRE_ACCOUNT, and the fair share of users in no account."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.placement.priority import no_account_factor
from apps.placement.topology import SpecError
from apps.scheduling import accounts, services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Account, AccountLimit, AccountMembership, Allocation, Job, Qos
from apps.topology import services as topology_services
from apps.topology.models import Cluster

from .conftest import EXAMPLES, small_spec, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(case44, alice, bob):
    """Account research (alice and bob) may use normal and high on case-4-4."""
    research = Account.objects.create(name="research", share=1)
    AccountMembership.objects.create(user=alice, account=research, is_default=True)
    AccountMembership.objects.create(user=bob, account=research, is_default=True)
    high = Qos.objects.create(cluster=case44, name="high", priority=50)
    research.qos.add(Qos.objects.get(cluster=case44, name="normal"), high)
    return research, high


def reloaded(job: Job) -> Job:
    job.refresh_from_db()
    return job


def test_every_cluster_has_normal_from_its_creation(case44):
    assert Qos.objects.filter(cluster=case44, name="normal").count() == 1


def test_a_job_gets_its_accounts_default_qos_or_the_one_it_names(team, alice, committed):
    research, high = team
    job = committed(services.job_submit, user=alice, spec=small_spec("plain", 2))
    assert job.qos.name == "normal" and job.account == research
    research.default_qos = "high"
    research.save()
    assert committed(services.job_submit, user=alice, spec=small_spec("d", 2)).qos == high
    named = committed(services.job_submit, user=alice, spec=small_spec("n", 2, qos="normal"))
    assert named.qos.name == "normal"
    assert named.spec["qos"] == "normal"


def test_a_qos_the_account_may_not_use_is_refused_naming_qos(team, case44, alice, alice_api, make_user):
    Qos.objects.create(cluster=case44, name="secret")
    response = alice_api.post("/api/v1/jobs/", small_spec("s", 2, qos="secret"), format="json")
    assert response.status_code == 400, response.content
    assert "may not use QOS 'secret'" in response.json()["qos"][0]
    response = alice_api.post("/api/v1/jobs/", small_spec("s", 2, qos="nonesuch"), format="json")
    assert response.status_code == 400 and "qos" in response.json()
    # A user in no account may use normal only.
    loner = token_client(make_user("loner"))
    assert loner.post("/api/v1/jobs/", small_spec("h", 2, qos="high"), format="json").status_code == 400
    assert loner.post("/api/v1/jobs/", small_spec("n", 2), format="json").status_code == 201
    assert not Job.objects.filter(name__in=["s", "h"]).exists()


def test_the_qos_priority_term_orders_the_queue(team, alice, committed):
    _, high = team
    blocker = committed(services.job_submit, user=alice, spec=small_spec("blocker", 16))
    low = committed(services.job_submit, user=alice, spec=small_spec("low", 16, priority=10))
    top = committed(services.job_submit, user=alice, spec=small_spec("top", 16, qos="high"))
    terms = accounts.job_priority(job=top)
    assert terms.qos == 50.0 and terms.qos_priority == 50
    assert terms.effective > accounts.job_priority(job=low).effective
    committed(services.job_complete, job=reloaded(blocker))
    assert reloaded(top).status == JobStatus.PLACING
    assert reloaded(low).status == JobStatus.QUEUED


def test_max_tres_per_job_refuses_at_submission_and_holds_a_queued_job(team, alice, alice_api, committed):
    _, high = team
    high.max_gpus_per_job = 4
    high.save()
    response = alice_api.post("/api/v1/jobs/", small_spec("big", 8, qos="high"), format="json")
    assert response.status_code == 400
    assert "QOS high allows at most 4 GPUs per job" in response.json()["gpus"][0]
    # Lowered after the job was queued: it waits, saying which limit holds it.
    blocker = committed(services.job_submit, user=alice, spec=small_spec("blocker", 16))
    job = committed(services.job_submit, user=alice, spec=small_spec("four", 4, qos="high"))
    Qos.objects.filter(pk=high.pk).update(max_gpus_per_job=2)
    committed(services.job_complete, job=reloaded(blocker))
    assert reloaded(job).pending_reason == "QOS high: GPUs per job 4 of at most 2"


def test_max_wall_refuses_a_longer_or_unbounded_time_limit(team, alice_api):
    _, high = team
    high.max_wall_s = 3600
    high.save()
    over = alice_api.post(
        "/api/v1/jobs/", small_spec("long", 2, qos="high", estimated_runtime_s=7200), format="json"
    )
    assert over.status_code == 400 and "at most 3600 s" in over.json()["estimated_runtime_s"][0]
    unbounded = small_spec("unbounded", 2, qos="high")
    del unbounded["estimated_runtime_s"]
    assert alice_api.post("/api/v1/jobs/", unbounded, format="json").status_code == 400
    assert alice_api.post("/api/v1/jobs/", small_spec("ok", 2, qos="high"), format="json").status_code == 201


def test_max_tres_per_user_holds_the_next_job_with_the_limit_named(team, alice, bob, committed):
    _, high = team
    high.max_running_gpus_per_user = 8
    high.save()
    first = committed(services.job_submit, user=alice, spec=small_spec("a1", 8, qos="high"))
    second = committed(services.job_submit, user=alice, spec=small_spec("a2", 4, qos="high"))
    others = committed(services.job_submit, user=bob, spec=small_spec("b1", 4, qos="high"))
    assert reloaded(first).status == JobStatus.PLACING
    assert reloaded(second).status == JobStatus.QUEUED
    assert reloaded(second).pending_reason == (
        "QOS high: running GPUs per user 8 of 8; this job's 4 would exceed it"
    )
    assert reloaded(others).status == JobStatus.PLACING
    # The job API shows the QOS and the reason.
    body = token_client(alice).get(f"/api/v1/jobs/{second.pk}/").json()
    assert body["qos"] == "high" and body["pending_reason"].startswith("QOS high: running GPUs per user")


def test_max_jobs_per_user(team, alice, committed):
    _, high = team
    high.max_running_jobs_per_user = 1
    high.save()
    committed(services.job_submit, user=alice, spec=small_spec("j1", 2, qos="high"))
    second = committed(services.job_submit, user=alice, spec=small_spec("j2", 2, qos="high"))
    assert reloaded(second).pending_reason == "QOS high: running jobs per user 1 of 1"
    # Another QOS is not held by it.
    assert (
        reloaded(committed(services.job_submit, user=alice, spec=small_spec("n", 2))).status
        == JobStatus.PLACING
    )


def test_running_gpus_and_jobs_per_account_count_every_member(team, alice, bob, committed):
    _, high = team
    high.max_running_gpus_per_account = 8
    high.max_running_jobs_per_account = 2
    high.save()
    committed(services.job_submit, user=alice, spec=small_spec("a", 6, qos="high"))
    held = committed(services.job_submit, user=bob, spec=small_spec("b", 4, qos="high"))
    assert reloaded(held).pending_reason == (
        "QOS high: running GPUs per account 6 of 8; this job's 4 would exceed it"
    )
    committed(services.job_submit, user=bob, spec=small_spec("b2", 1, qos="high"))
    third = committed(services.job_submit, user=bob, spec=small_spec("b3", 1, qos="high"))
    assert reloaded(third).pending_reason == "QOS high: running jobs per account 2 of 2"


def test_queued_caps_per_user_and_per_account_in_a_qos(team, case44, alice, bob, alice_api, committed):
    _, high = team
    high.max_queued_per_user = 2
    high.max_queued_per_account = 3
    high.save()
    committed(services.job_submit, user=alice, spec=small_spec("blocker", 16))
    for i in range(2):
        assert (
            alice_api.post("/api/v1/jobs/", small_spec(f"a{i}", 2, qos="high"), format="json").status_code
            == 201
        )
    refused = alice_api.post("/api/v1/jobs/", small_spec("a2", 2, qos="high"), format="json")
    assert refused.status_code == 409
    assert (refused.json()["limit"], refused.json()["value"], refused.json()["queued"]) == (
        "QOS high: queued jobs per user",
        2,
        2,
    )
    # Other QOS are not capped by it.
    assert alice_api.post("/api/v1/jobs/", small_spec("n", 2), format="json").status_code == 201
    # The account's cap counts alice's jobs against bob's; a bulk list over it queues nothing.
    with pytest.raises(services.QueuedCapExceeded) as exc:
        services.job_submit_many(user=bob, specs=[small_spec(f"b{i}", 2, qos="high") for i in range(2)])
    assert (exc.value.limit, exc.value.queued) == ("QOS high: queued jobs per account (research)", 2)
    assert not Job.objects.filter(owner=bob).exists()
    services.job_submit_many(user=bob, specs=[small_spec("b0", 2, qos="high")])


def test_qos_gpu_hour_budget_is_charged_ahead(team, alice, committed):
    """GrpTRESMins with Slurm's `safe` enforcement: a job whose GPUs x time limit does not fit in
    what is left waits; a shorter one starts."""
    _, high = team
    high.gpu_hours_per_period = 10
    high.save()
    long = committed(
        services.job_submit, user=alice, spec=small_spec("long", 4, qos="high", estimated_runtime_s=3 * 3600)
    )
    assert reloaded(long).status == JobStatus.QUEUED
    assert "QOS high has 10.0 of its 10 GPU-hours per 24 h left" in reloaded(long).pending_reason
    assert "need 12.0" in reloaded(long).pending_reason
    short = committed(
        services.job_submit, user=alice, spec=small_spec("short", 4, qos="high", estimated_runtime_s=3600)
    )
    assert reloaded(short).status == JobStatus.PLACING
    # The running job's 4 GPU-hours are held against the budget: 6 left, not enough for 8.
    eight = committed(
        services.job_submit, user=alice, spec=small_spec("eight", 4, qos="high", estimated_runtime_s=7200)
    )
    assert "has 6.0 of its 10" in reloaded(eight).pending_reason


def test_account_gpu_hour_budget_is_charged_ahead(team, case44, alice, committed):
    """The issue's case: an 8-GPU job for 30 days against a 100 GPU-hour budget waits."""
    research, _ = team
    AccountLimit.objects.create(account=research, cluster=case44, gpu_hours_per_period=100)
    month = committed(
        services.job_submit, user=alice, spec=small_spec("month", 8, estimated_runtime_s=30 * 86400)
    )
    assert reloaded(month).status == JobStatus.QUEUED
    assert reloaded(month).pending_reason.startswith(
        "account research has 100.0 of its 100 GPU-hours per 24 h left"
    )
    day = committed(
        services.job_submit, user=alice, spec=small_spec("hours", 8, estimated_runtime_s=10 * 3600)
    )
    assert reloaded(day).status == JobStatus.PLACING


def test_scavenger_borrows_idle_gpus_and_is_preempted_first(team, case44, alice, bob, committed):
    research, _ = team
    scavenger = Qos.objects.create(
        cluster=case44,
        name="scavenger",
        priority=-50,
        max_running_gpus_per_account=0,
        may_borrow=True,
        preemptible=True,
    )
    research.qos.add(scavenger)
    assert not case44.preemption_enabled
    scav = committed(
        services.job_submit, user=bob, spec=small_spec("scav", 16, qos="scavenger", priority=100)
    )
    scav = reloaded(scav)
    assert scav.status == JobStatus.PLACING and scav.borrowed
    committed(services.job_start, job=scav)
    # A normal job of the same account, lower requested priority, on a cluster without preemption.
    normal = committed(services.job_submit, user=alice, spec=small_spec("normal", 8, priority=0))
    scav = reloaded(scav)
    assert scav.status == JobStatus.PREEMPTED
    assert (
        scav.requeue_reason
        == f"preempted by job {normal.pk} of QOS normal: QOS scavenger may be preempted by others"
    )
    assert reloaded(normal).status == JobStatus.PLACING
    # Waiting again, it does not preempt anything itself: it waits for idle GPUs.
    committed(services.schedule_cluster, cluster=case44)
    assert "it may borrow idle GPUs, but does not fit on them" in reloaded(scav).pending_reason


def test_several_accounts_per_user_and_a_job_naming_its_account(team, case44, alice, alice_api, committed):
    research, _ = team
    product = Account.objects.create(name="product")
    AccountMembership.objects.create(user=alice, account=product)
    job = committed(services.job_submit, user=alice, spec=small_spec("default", 2))
    assert job.account == research
    named = committed(services.job_submit, user=alice, spec=small_spec("paid", 2, account="product"))
    assert named.account == product and named.qos.name == "normal"
    Account.objects.create(name="other")
    refused = alice_api.post("/api/v1/jobs/", small_spec("x", 2, account="other"), format="json")
    assert refused.status_code == 400 and "not a member" in refused.json()["account"][0]
    bulk = alice_api.post(
        "/api/v1/jobs/", [small_spec("b", 2), small_spec("c", 2, account="nope")], format="json"
    )
    assert bulk.status_code == 400 and "[1].account" in bulk.json()
    # One default per user.
    with pytest.raises(Exception):  # noqa: B017  (IntegrityError, wrapped by the test transaction)
        AccountMembership.objects.filter(user=alice, account=product).update(is_default=True)


def test_require_account_refuses_users_in_no_account(case44, make_user, settings):
    loner = make_user("loner")
    client = token_client(loner)
    assert client.post("/api/v1/jobs/", small_spec("free", 2), format="json").status_code == 201
    settings.REQUIRE_ACCOUNT = True
    response = client.post("/api/v1/jobs/", small_spec("refused", 2), format="json")
    assert response.status_code == 400
    assert "TOPOWEB_REQUIRE_ACCOUNT" in response.json()["account"][0]
    assert not Job.objects.filter(name="refused").exists()
    with pytest.raises(SpecError):
        services.job_submit_many(user=loner, specs=[small_spec("bulk", 2)])


def test_users_in_no_account_get_no_better_fair_share_than_any_account(
    team, case44, alice, make_user, committed
):
    assert no_account_factor({}) == 0.5
    assert no_account_factor({1: 0.9, 2: 0.3}) == 0.3
    assert no_account_factor({1: 0.9}) == 0.5
    # research used the whole cluster recently, product nothing: research's factor is 0.25, and
    # a loner's is no better.
    Account.objects.create(name="product", share=1)
    old = committed(services.job_submit, user=alice, spec=small_spec("old", 16))
    committed(services.job_complete, job=reloaded(old))
    Allocation.objects.filter(job=old).update(
        created_at=timezone.now() - timedelta(hours=5), released_at=timezone.now() - timedelta(hours=1)
    )
    loner = make_user("loner")
    theirs = committed(services.job_submit, user=loner, spec=small_spec("loner", 2))
    ours = committed(services.job_submit, user=alice, spec=small_spec("ours", 2))
    assert (
        accounts.job_priority(job=theirs).fair_share_factor
        == accounts.job_priority(job=ours).fair_share_factor
    )
    assert accounts.job_priority(job=theirs).fair_share_factor == pytest.approx(0.25, abs=0.01)


def test_qos_api_reads_for_everyone_changes_for_operators(team, case44, alice, make_user):
    viewer = token_client(alice)
    listed = viewer.get("/api/v1/qos/?cluster=case-4-4").json()["results"]
    assert {q["name"] for q in listed} == {"normal", "high"}
    body = {
        "cluster": "case-4-4",
        "name": "scavenger",
        "priority": -10,
        "may_borrow": True,
        "preemptible": True,
    }
    assert viewer.post("/api/v1/qos/", body, format="json").status_code == 403
    operator = token_client(make_user("op", role="operator"))
    created = operator.post("/api/v1/qos/", body, format="json")
    assert created.status_code == 201, created.content
    assert operator.post("/api/v1/qos/", body, format="json").status_code == 400  # name taken
    bad = operator.patch(f"/api/v1/qos/{created.json()['id']}/", {"max_wall_s": 1e308}, format="json")
    assert bad.status_code == 400 and "max_wall_s" in bad.json()
    normal = Qos.objects.get(cluster=case44, name="normal")
    assert operator.delete(f"/api/v1/qos/{normal.pk}/").status_code == 400
    assert operator.patch(f"/api/v1/qos/{normal.pk}/", {"name": "other"}, format="json").status_code == 400
    assert operator.delete(f"/api/v1/qos/{created.json()['id']}/").status_code == 204


def test_a_new_cluster_gets_normal(db):
    from apps.placement.topology import read_spec_file

    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    assert isinstance(cluster, Cluster)
    assert list(cluster.qos.values_list("name", flat=True)) == ["normal"]

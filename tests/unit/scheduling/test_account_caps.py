"""Limits an account and a QOS set on all their jobs together (docs/accounts.md's table): queued
jobs per account outside any QOS (MaxSubmitJobs), running jobs per account on a cluster
(MaxJobs/GrpJobs), a QOS's running GPUs and jobs of all its jobs (GrpTRES, GrpJobs), and budgets
and wall-time limits read from the job's time_limit_min when it sets one."""

from __future__ import annotations

import pytest

from apps.placement.topology import SpecError
from apps.scheduling import services
from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Account, AccountLimit, AccountMembership, Job, Qos

from .conftest import small_spec, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def research(case44, alice, bob):
    """Account research: alice and bob; it may use normal and high on case-4-4."""
    account = Account.objects.create(name="research")
    for user in (alice, bob):
        AccountMembership.objects.create(user=user, account=account, is_default=True)
    high = Qos.objects.create(cluster=case44, name="high")
    account.qos.add(Qos.objects.get(cluster=case44, name="normal"), high)
    return account, high


def reloaded(job: Job) -> Job:
    job.refresh_from_db()
    return job


def test_queued_jobs_per_account_is_a_409_naming_it_and_a_bulk_list_is_all_or_nothing(
    research, alice, bob, committed
):
    account, _ = research
    account.max_queued_jobs = 2
    account.save()
    committed(services.job_submit, user=alice, spec=small_spec("all", 16))
    committed(services.job_submit, user=alice, spec=small_spec("w1", 8))
    bulk = token_client(bob).post("/api/v1/jobs/", [small_spec("b1", 8), small_spec("b2", 8)], format="json")
    assert bulk.status_code == 409, bulk.content
    assert bulk.json() | {"detail": ""} == {
        "detail": "",
        "limit": "account research: queued jobs",
        "value": 2,
        "queued": 1,
    }
    assert not Job.objects.filter(owner=bob).exists()
    # One more fits; then the account (both members together) is at its cap.
    committed(services.job_submit, user=bob, spec=small_spec("b1", 8))
    with pytest.raises(services.QueuedCapExceeded) as exc:
        services.job_submit(user=alice, spec=small_spec("w2", 8))
    assert (exc.value.limit, exc.value.value, exc.value.queued) == ("account research: queued jobs", 2, 2)


def test_running_jobs_per_account_on_a_cluster_holds_the_next_job(research, alice, bob, case44, committed):
    account, _ = research
    AccountLimit.objects.create(account=account, cluster=case44, max_running_jobs=1)
    first = committed(services.job_submit, user=alice, spec=small_spec("a", 2))
    second = committed(services.job_submit, user=bob, spec=small_spec("b", 2))
    assert reloaded(first).status == JobStatus.PLACING
    assert reloaded(second).status == JobStatus.QUEUED
    assert reloaded(second).pending_reason == "account research runs 1 of its limit of 1 running jobs"
    committed(services.job_cancel, job=first)
    assert reloaded(second).status == JobStatus.PLACING


def test_a_qos_caps_the_gpus_and_jobs_of_all_its_jobs_together(research, alice, bob, make_user, committed):
    _, high = research
    high.max_running_gpus = 8
    high.save()
    first = committed(services.job_submit, user=alice, spec=small_spec("a", 8, qos="high"))
    second = committed(services.job_submit, user=bob, spec=small_spec("b", 4, qos="high"))
    plain = committed(services.job_submit, user=bob, spec=small_spec("n", 4))
    assert reloaded(first).status == JobStatus.PLACING
    assert reloaded(second).pending_reason == "QOS high: running GPUs 8 of 8; this job's 4 would exceed it"
    assert reloaded(plain).status == JobStatus.PLACING
    committed(services.job_cancel, job=first)
    assert reloaded(second).status == JobStatus.PLACING
    high.max_running_gpus, high.max_running_jobs = None, 1
    high.save()
    later = committed(services.job_submit, user=alice, spec=small_spec("d", 1, qos="high"))
    assert reloaded(later).pending_reason == "QOS high: running jobs 1 of 1"


def test_the_budget_charges_gpus_times_time_limit_min_when_the_job_sets_one(
    research, alice, case44, committed
):
    account, _ = research
    AccountLimit.objects.create(account=account, cluster=case44, gpu_hours_per_period=50)
    # An estimate of a minute, but a time limit of 10 hours: 8 x 10 = 80 GPU-hours, over 50.
    job = committed(
        services.job_submit,
        user=alice,
        spec=small_spec("long", 8, estimated_runtime_s=60, time_limit_min=600),
    )
    assert reloaded(job).status == JobStatus.QUEUED
    assert "this job's GPUs x time limit need 80.0" in reloaded(job).pending_reason
    # Within the budget with a 6-hour limit (48 GPU-hours): it starts, and holds 48 of the 50 ahead.
    fits = committed(
        services.job_submit,
        user=alice,
        spec=small_spec("fits", 8, estimated_runtime_s=36000, time_limit_min=360),
    )
    assert reloaded(fits).status == JobStatus.PLACING
    small = committed(services.job_submit, user=alice, spec=small_spec("small", 2, time_limit_min=120))
    assert reloaded(small).status == JobStatus.QUEUED
    assert "48.0 held by running jobs' time limits" in reloaded(small).pending_reason


def test_a_qos_max_wall_bounds_time_limit_min_when_set(research, alice):
    _, high = research
    high.max_wall_s = 3600
    high.save()
    with pytest.raises(SpecError) as err:
        services.job_submit(
            user=alice, spec=small_spec("t", 2, qos="high", estimated_runtime_s=60, time_limit_min=61)
        )
    assert "allows jobs of at most 3600 s" in err.value.as_dict()["time_limit_min"][0]
    job = services.job_submit(
        user=alice, spec=small_spec("ok", 2, qos="high", estimated_runtime_s=7200, time_limit_min=60)
    )
    assert job.qos == high


def test_the_job_api_names_account_and_qos_as_a_spec_does_and_filters_by_them(
    research, alice, alice_api, committed
):
    account, high = research
    job = committed(services.job_submit, user=alice, spec=small_spec("h", 2, qos="high"))
    plain = committed(services.job_submit, user=alice, spec=small_spec("n", 2))
    body = alice_api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (body["account"], body["qos"], body["held"]) == ("research", "high", False)
    assert body["spec"]["qos"] == "high"
    by_qos = alice_api.get("/api/v1/jobs/?qos=high").json()["results"]
    assert [j["id"] for j in by_qos] == [job.pk]
    by_id = alice_api.get(f"/api/v1/jobs/?qos={high.pk}").json()["results"]
    assert [j["id"] for j in by_id] == [job.pk]
    both = alice_api.get("/api/v1/jobs/?account=research").json()["results"]
    assert {j["id"] for j in both} == {job.pk, plain.pk}
    assert alice_api.get("/api/v1/jobs/?held=true").json()["results"] == []

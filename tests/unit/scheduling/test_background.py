"""Tasks, the embedded periodic scheduler, the demo loader and the management commands."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from apps.scheduling import services, tasks
from apps.scheduling.choices import JobStatus, ProposalStatus
from apps.scheduling.demo import demo_workload_refill, load_demo_jobs
from apps.scheduling.embedded import PeriodicScheduler, start_periodic_scheduler
from apps.scheduling.models import AccountMembership, Job, LauncherToken, MigrationProposal, SchedulingCycle
from apps.scheduling.node_models import node_key_hash
from tests.writeslots import slot_free

from .conftest import small_spec

pytestmark = pytest.mark.django_db


def queued_without_cycle(user, spec) -> Job:
    """Submit, dropping the queued cycle (as if the broker lost it)."""
    with transaction.atomic():
        job = services.job_submit(user=user, spec=spec)
        transaction.get_connection().run_on_commit.clear()
    return job


def test_schedule_task_runs_a_cycle_and_returns_its_id(case44, alice):
    job = queued_without_cycle(alice, small_spec("t", 2))
    cycle_id = tasks.schedule_cluster_task(case44.pk)
    assert SchedulingCycle.objects.get(pk=cycle_id).placed_jobs == [job.pk]


def test_tasks_return_quietly_when_the_cluster_is_gone(db):
    assert tasks.schedule_cluster_task(987654) is None
    assert tasks.propose_migrations_task(987654) == 0


def test_beat_task_queues_a_cycle_per_cluster(case44, pod256, alice):
    queued_without_cycle(alice, small_spec("t", 2))
    assert tasks.schedule_all_clusters_task() == 2
    assert SchedulingCycle.objects.filter(cluster__in=[case44, pod256]).count() == 2
    assert Job.objects.get().status == JobStatus.PLACING


def test_beat_schedule_names_registered_tasks():
    from topoweb.celery import app

    for entry in tasks.BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks
        assert entry["schedule"] > 0


def test_periodic_scheduler_tick_places_waiting_jobs(transactional_db, case44, alice):
    # Outside a test transaction, as the scheduler's thread runs: its tick starts with
    # close_old_connections, which closes a connection left in a transaction (Postgres).
    job = queued_without_cycle(alice, small_spec("t", 4))
    PeriodicScheduler(interval_s=60).tick()
    assert Job.objects.get(pk=job.pk).status == JobStatus.PLACING


def test_periodic_scheduler_refuses_a_non_positive_interval():
    with pytest.raises(ValueError, match="interval_s"):
        PeriodicScheduler(interval_s=0)


def test_start_periodic_scheduler_starts_one_thread(monkeypatch):
    monkeypatch.setattr(PeriodicScheduler, "tick", lambda self: None)
    first = start_periodic_scheduler(interval_s=3600)
    try:
        assert first.is_alive() and first.daemon
        assert start_periodic_scheduler(interval_s=3600) is first
    finally:
        first.stop()
        first.join(timeout=5)
    assert not first.is_alive()


def test_demo_jobs_load_once_with_a_waiting_job_and_a_proposal(pod256, case44, su_h100):
    loaded = load_demo_jobs()
    assert loaded == {"pod-256": 9, "su-h100": 2, "case-4-4": 1}
    pod_jobs = Job.objects.filter(cluster=pod256)
    assert set(pod_jobs.values_list("owner__username", flat=True)) == {"alice", "bob"}
    waiting = pod_jobs.get(status=JobStatus.QUEUED)
    assert waiting.gpus == 192 and "reserved to start at" in waiting.pending_reason
    # Every demo job carries a command: placed, waiting for the node agents to start its ranks.
    placed = pod_jobs.filter(status=JobStatus.PLACING)
    assert placed.count() == 8 and all(job.spec["command"] for job in placed)
    for job in placed:
        services.job_start(job=job)
    services.migrations_propose(cluster=pod256)
    proposal = MigrationProposal.objects.get(status=ProposalStatus.PROPOSED)
    assert proposal.job.name == "llm-tp8-dp2-naive" and proposal.predicted_gain > 0.05
    bert = Job.objects.get(cluster=case44)
    # Its ranks start when the node agents run them (serve_embedded runs them; not here).
    assert bert.status == JobStatus.PLACING and bert.placed_policy == "naive"
    assert bert.predicted_step_ms == pytest.approx(209.09, abs=0.01)
    assert load_demo_jobs() == {"pod-256": 0, "su-h100": 0, "case-4-4": 0}
    assert Job.objects.count() == 12
    # Each demo team has its coordinator.
    coordinators = AccountMembership.objects.filter(is_coordinator=True)
    assert set(coordinators.values_list("user__username", "account__name")) == {
        ("alice", "research"),
        ("bob", "product"),
    }


def test_finished_demo_jobs_come_back_and_active_ones_are_not_doubled(pod256, case44, committed):
    from datetime import timedelta

    from django.utils import timezone

    load_demo_jobs(start_all=True)
    assert demo_workload_refill() == []  # nothing finished: nothing submitted
    done = Job.objects.get(cluster=pod256, name="finetune-1gpu")
    failed = Job.objects.get(cluster=case44)
    services.job_complete(job=done)
    services.job_fail(job=failed, reason="rank 3 exited 1")
    now = timezone.now()
    # Finished a moment ago: still shown as finished, not yet resubmitted.
    assert demo_workload_refill(now=now + timedelta(seconds=5), after_s=20) == []
    again = committed(demo_workload_refill, now=now + timedelta(seconds=30), after_s=20)
    assert sorted(j.name for j in again) == ["bert-large-16", "finetune-1gpu"]
    copy = Job.objects.filter(cluster=pod256, name="finetune-1gpu").latest("pk")
    assert copy.pk != done.pk and copy.owner == done.owner and copy.spec["command"]
    # The cycle its submission queued placed it on the GPUs the finished copy left.
    assert copy.status == JobStatus.PLACING
    assert Job.objects.get(pk=[j for j in again if j.name == "bert-large-16"][0].pk).placed_policy == "naive"
    # The copies wait or run: a second pass submits nothing more.
    assert demo_workload_refill(now=now + timedelta(seconds=60), after_s=20) == []
    assert Job.objects.filter(name="finetune-1gpu").count() == 2


def test_demo_rail_job_keeps_each_dp_ring_on_one_rail_leaf(su_h100):
    load_demo_jobs()
    job = Job.objects.get(cluster=su_h100, name="llm-rail-tp8-dp8")
    assert job.status == JobStatus.PLACING
    dp_levels = {g["level"] for g in job.predicted["groups"] if g["group"] == "dp"}
    assert dp_levels == {"leaf"}


def test_create_launcher_token_prints_a_working_key(case44):
    out = io.StringIO()
    call_command("create_launcher_token", "case-4-4", stdout=out)
    key = out.getvalue().strip()
    token = LauncherToken.objects.get(key_hash=node_key_hash(key))
    assert token.cluster == case44 and token.prefix == key[:10] and key.startswith("tl_")
    # Only the hash is stored: the key is in no column of the row.
    assert key not in str(LauncherToken.objects.filter(pk=token.pk).values().get())


def test_create_launcher_token_of_an_unknown_cluster_fails(db):
    with pytest.raises(CommandError, match="unknown cluster 'nope'"):
        call_command("create_launcher_token", "nope", stdout=io.StringIO())


def test_cycle_requests_fold_into_the_one_not_yet_started(case44, monkeypatch):
    from apps.scheduling import cycle

    sent = []
    monkeypatch.setattr(cycle, "coalescing", lambda: True)
    monkeypatch.setattr(tasks.schedule_cluster_task, "delay", lambda cluster_id: sent.append(cluster_id))
    assert cycle.request_cycle(case44.pk) is True
    assert cycle.request_cycle(case44.pk) is False
    assert sent == [case44.pk]
    # The queued cycle takes its snapshot: later requests need a cycle of their own.
    services.schedule_cluster(cluster=case44)
    assert cycle.request_cycle(case44.pk) is True
    assert sent == [case44.pk, case44.pk]


def test_without_a_shared_cache_every_request_queues_a_cycle(case44, monkeypatch):
    from apps.scheduling import cycle
    from topoweb.celery import app

    sent = []
    monkeypatch.setattr(app.conf, "task_always_eager", False)
    monkeypatch.setattr(tasks.schedule_cluster_task, "delay", lambda cluster_id: sent.append(cluster_id))
    # The test settings use a local-memory cache, which worker processes would not share.
    assert cycle.coalescing() is False
    assert cycle.request_cycle(case44.pk) and cycle.request_cycle(case44.pk)
    assert sent == [case44.pk, case44.pk]


@pytest.mark.django_db(transaction=True)
def test_an_api_submission_requests_its_cycle_once_its_write_slot_is_free(
    transactional_db, case44, alice_api, settings, monkeypatch
):
    from apps.scheduling import cycle

    settings.API_WRITE_SLOTS = 1
    seen = []

    def request_cycle(cluster_id, **kwargs):
        seen.append((cluster_id, slot_free()))
        return True

    monkeypatch.setattr(cycle, "cycles_run_inline", lambda: False)
    monkeypatch.setattr(cycle, "request_cycle", request_cycle)
    response = alice_api.post("/api/v1/jobs/", small_spec("one", 2), format="json")
    assert response.status_code == 201, response.content
    assert seen == [(case44.pk, True)]
    # A bulk submission: one request for its cluster, also once the slot is free.
    response = alice_api.post("/api/v1/jobs/", [small_spec(f"b{i}", 2) for i in range(3)], format="json")
    assert response.status_code == 201, response.content
    assert seen == [(case44.pk, True)] * 2
    # Refused (nothing committed): no request.
    response = alice_api.post("/api/v1/jobs/", small_spec("too-big", 4096), format="json")
    assert response.status_code == 400
    assert len(seen) == 2


def test_requests_deferred_collects_only_where_cycles_go_to_a_broker(case44, monkeypatch):
    from apps.scheduling import cycle

    seen, deferred = [], []
    monkeypatch.setattr(cycle, "request_cycle", lambda cluster_id, **kwargs: seen.append(cluster_id))
    monkeypatch.setattr(cycle, "cycles_run_inline", lambda: False)
    with cycle.requests_deferred(deferred.append):
        cycle._request_or_collect(case44.pk)
        cycle._request_or_collect(case44.pk)
        assert seen == []
    (send,) = deferred
    send()
    assert seen == [case44.pk]
    # Where the cycle runs in the requesting process, it runs on commit as always.
    monkeypatch.setattr(cycle, "cycles_run_inline", lambda: True)
    with cycle.requests_deferred(deferred.append):
        cycle._request_or_collect(case44.pk)
        assert seen == [case44.pk] * 2
    assert len(deferred) == 1

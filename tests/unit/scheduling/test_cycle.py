"""Submission and the scheduling cycle service on SQLite: booking, audit, atomicity, preemption."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.placement.planner import plan_cycle
from apps.placement.topology import SpecError
from apps.scheduling import cycle, lifecycle, selectors, services, snapshot
from apps.scheduling.choices import CycleStatus, JobStatus
from apps.scheduling.models import Allocation, Job, SchedulingCycle
from apps.topology.models import Gpu

from .conftest import small_spec

pytestmark = pytest.mark.django_db


def nodes_of(job: Job) -> list[tuple[str, int]]:
    return [(r["node"], r["gpu"]) for r in selectors.job_ranks(job=job)]


def test_case44_job_keeps_each_dp_group_on_one_node(case44, alice, job_spec, committed):
    job = committed(services.job_submit, user=alice, spec=job_spec())
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING
    ranks = nodes_of(job)
    assert ranks[:8] == [("node-a", g) for g in range(8)] or ranks[:8] == [("node-b", g) for g in range(8)]
    assert {n for n, _ in ranks[8:]} == {"node-b" if ranks[0][0] == "node-a" else "node-a"}
    assert job.predicted_step_ms == pytest.approx(102.67, abs=0.01)
    assert [g["level"] for g in job.predicted["groups"] if g["group"] == "dp"] == ["nvlink", "nvlink"]


def test_second_job_waits_with_a_reason_and_starts_when_the_first_completes(
    case44, alice, job_spec, committed
):
    first = committed(services.job_submit, user=alice, spec=job_spec())
    second = committed(services.job_submit, user=alice, spec=job_spec(name="second"))
    second.refresh_from_db()
    assert second.status == JobStatus.QUEUED
    assert second.pending_reason.startswith("needs 16 GPUs, 0 free")
    assert f"when job {first.pk} is expected to end" in second.pending_reason
    committed(services.job_start, job=first)
    committed(services.job_complete, job=first)
    second.refresh_from_db()
    assert second.status == JobStatus.PLACING and second.pending_reason == ""
    assert Allocation.objects.filter(job=first, live=True).count() == 0
    assert Allocation.objects.filter(job=second, live=True).count() == 16


def test_cycle_audit_records_what_was_placed_and_why_others_wait(case44, alice, job_spec):
    with transaction.atomic():
        a = services.job_submit(user=alice, spec=job_spec(name="a", priority=1))
        b = services.job_submit(user=alice, spec=job_spec(name="b"))
    record = services.schedule_cluster(cluster=case44)
    assert record.status == CycleStatus.COMPLETED
    assert record.placed_jobs == [a.pk] and record.placed == 1
    assert record.skipped[str(b.pk)].startswith("needs 16 GPUs, 0 free")
    assert record.duration_ms > 0


def test_submitting_queues_a_cycle_on_commit(case44, alice, job_spec, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = services.job_submit(user=alice, spec=job_spec())
    assert len(callbacks) == 1
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED
    callbacks[0]()
    assert Job.objects.get(pk=job.pk).status == JobStatus.PLACING


def test_job_cancelled_after_planning_gets_no_gpus(case44, alice, job_spec):
    job = services.job_submit(user=alice, spec=job_spec())
    snap = snapshot.cluster_snapshot(cluster=case44)
    queue = snapshot.queued_jobs(cluster=case44)
    plan = plan_cycle(snap, queue, cluster_policy="topo", backfill=True, preemption=False, now=timezone.now())
    assert [b.job.job_id for b in plan.bookings] == [job.pk]
    services.job_cancel(job=job, user=alice)
    with transaction.atomic():
        placed, _ = cycle._commit(snap, plan, queue, timezone.now())
    assert placed == []
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED
    assert not Allocation.objects.filter(job=job).exists()


def test_a_gpu_cannot_hold_two_live_allocations(case44, alice, job_spec, committed):
    job = committed(services.job_submit, user=alice, spec=job_spec())
    other = Job.objects.create(
        name="x", cluster=case44, owner=alice, spec=job.spec, gpus=16, status=JobStatus.PLACING
    )
    gpu = Allocation.objects.filter(job=job, live=True).first().gpu
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(job=other, rank=0, gpu=gpu, live=True)
    Allocation.objects.create(job=other, rank=0, gpu=gpu, live=False)
    assert Allocation.objects.filter(gpu=gpu).count() == 2


def test_failed_cycle_books_nothing_and_is_recorded(case44, alice, job_spec, monkeypatch):
    with transaction.atomic():
        a = services.job_submit(user=alice, spec=small_spec("a", 8))
        b = services.job_submit(user=alice, spec=small_spec("b", 8))
    real_book = lifecycle._book
    calls = []

    def book_then_die(**kwargs):
        calls.append([job_id for job_id, _ in kwargs["bookings"]])
        real_book(**kwargs)
        raise RuntimeError("worker lost mid-cycle")

    monkeypatch.setattr(lifecycle, "_book", book_then_die)
    with pytest.raises(RuntimeError):
        services.schedule_cluster(cluster=case44)
    # Both jobs' rows were written before the failure, and none survive it.
    assert calls == [[a.pk, b.pk]]
    assert not Allocation.objects.exists()
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.QUEUED}
    failed = SchedulingCycle.objects.get()
    assert failed.status == CycleStatus.FAILED and "worker lost mid-cycle" in failed.error
    monkeypatch.setattr(lifecycle, "_book", real_book)
    assert services.schedule_cluster(cluster=case44).placed == 2


def test_preempted_job_goes_back_to_the_queue_and_returns(case44, alice, bob, committed):
    case44.preemption_enabled = True
    case44.save()
    low = committed(services.job_submit, user=bob, spec=small_spec("low", 16, priority=0))
    committed(services.job_start, job=low)
    high = committed(services.job_submit, user=alice, spec=small_spec("high", 8, priority=5))
    low.refresh_from_db()
    high.refresh_from_db()
    assert high.status == JobStatus.PLACING
    assert low.status == JobStatus.PREEMPTED
    assert low.pending_reason == f"preempted by job {high.pk} (priority 5)"
    assert low.preemptions == 1 and low.started_at is None
    assert Allocation.objects.filter(job=low, live=True).count() == 0
    committed(services.job_complete, job=high)
    low.refresh_from_db()
    assert low.requeue_reason == f"preempted by job {high.pk} (priority 5)" and low.requeued_at
    assert low.status == JobStatus.PLACING
    assert Allocation.objects.filter(job=low, live=True).count() == 16


def test_without_preemption_a_higher_priority_job_waits(case44, alice, bob, committed):
    low = committed(services.job_submit, user=bob, spec=small_spec("low", 16, priority=0))
    high = committed(services.job_submit, user=alice, spec=small_spec("high", 8, priority=5))
    low.refresh_from_db()
    high.refresh_from_db()
    assert (low.status, high.status) == (JobStatus.PLACING, JobStatus.QUEUED)
    assert "needs 8 GPUs, 0 free" in high.pending_reason


def test_link_loads_are_the_sum_of_active_jobs_flows(pod256, alice, committed):
    spec = small_spec("wide", 128, cluster="pod-256")
    job = committed(services.job_submit, user=alice, spec=spec)
    job.refresh_from_db()
    assert job.flows, "a 128-GPU job spans leaves and must put flows on their uplinks"
    assert selectors.link_loads(cluster=pod256) == pytest.approx(job.flows)
    snap = snapshot.cluster_snapshot(cluster=pod256)
    assert snap.link_load == pytest.approx(job.flows)
    assert int((~snap.free).sum()) == 128


def test_running_job_past_twice_its_estimate_is_flagged_not_stopped(case44, alice, committed):
    job = committed(services.job_submit, user=alice, spec=small_spec("slow", 4, estimated_runtime_s=100))
    committed(services.job_start, job=job)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=250))
    services.schedule_cluster(cluster=case44)
    job.refresh_from_db()
    assert job.overdue is True and job.status == JobStatus.RUNNING
    assert "past twice its estimated runtime of 100 s" in job.overdue_reason


def test_invalid_spec_is_refused_naming_the_field_and_writes_nothing(case44, alice, job_spec):
    bad = job_spec(parallelism={"tp": 1, "pp": 2, "dp": 6})
    with pytest.raises(SpecError) as err:
        services.job_submit(user=alice, spec=bad)
    assert err.value.as_dict() == {"parallelism": ["tp*pp*dp=12 but gpus=16"]}
    assert not Job.objects.exists()


def test_job_larger_than_the_cluster_is_refused_on_gpus(case44, alice):
    with pytest.raises(SpecError) as err:
        services.job_submit(user=alice, spec=small_spec("huge", 32))
    assert err.value.as_dict()["gpus"] == ["needs 32 GPUs but cluster 'case-4-4' has 16"]


def test_unknown_cluster_is_refused_on_cluster(db, alice):
    with pytest.raises(SpecError) as err:
        services.job_submit(user=alice, spec=small_spec("x", 1, cluster="nowhere"))
    assert err.value.as_dict() == {"cluster": ["unknown cluster 'nowhere'"]}


def test_user_in_the_spec_is_replaced_by_the_submitter(case44, alice, job_spec):
    job = services.job_submit(user=alice, spec=job_spec(user="mallory"))
    assert job.owner == alice and job.spec["user"] == "alice"


def test_free_gpus_selector_excludes_live_allocations(case44, alice, committed):
    committed(services.job_submit, user=alice, spec=small_spec("four", 4))
    free = selectors.free_gpus(cluster=case44)
    assert free.count() == 12
    assert Gpu.objects.filter(node__cluster=case44).count() == 16

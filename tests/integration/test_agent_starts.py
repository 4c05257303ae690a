"""Rank starts of a placing job reported by its nodes at once (Postgres): recorded under a shared
lock of the job, so no node's report waits for another's, while a change of the job's state still
excludes them; the job starts exactly once, when its last rank is reported."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from apps.executors.agents import services as agent_services
from apps.scheduling import services
from apps.scheduling.choices import JobStatus
from apps.scheduling.lifecycle import RankEvent
from apps.scheduling.models import Allocation, Job, RankRun
from apps.topology.models import Node

from .test_agents import cluster, eager_cycles, spec, user  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def postgres_only(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("the shared lock of starts is Postgres's")


def _placed(user, tmp_path, gpus=16) -> Job:
    job = services.job_submit(user=user, spec=spec(tmp_path, "starts", gpus))
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING, job.pending_reason
    return job


def _starts(job: Job) -> dict[str, list[RankEvent]]:
    """Each node's start reports of the job's ranks."""
    out: dict[str, list[RankEvent]] = {}
    for rank, node in Allocation.objects.filter(job=job, live=True).values_list("rank", "node_name"):
        out.setdefault(node, []).append(RankEvent(job.pk, job.generation, rank, "started", pid=100 + rank))
    return out


def _report(cluster, name: str, events: list[RankEvent], errors: list, barrier=None) -> None:
    try:
        if barrier is not None:
            barrier.wait(timeout=10)
        node = Node.objects.get(cluster=cluster, name=name)
        refused = agent_services.agent_report(node=node, reports=events)
        if refused:
            errors.append(refused)
    except Exception as exc:  # collected: the test fails naming it
        errors.append(exc)
    finally:
        connections.close_all()


def test_every_node_reporting_its_starts_at_once_twice_starts_the_job_once(cluster, user, tmp_path):
    """Each node sends its starts twice at the same moment (a sync retried while the first is still
    being handled): every run is recorded once, nothing is refused, the job is running."""
    job = _placed(user, tmp_path)
    per_node = _starts(job)
    assert len(per_node) > 1
    errors: list = []
    barrier = threading.Barrier(2 * len(per_node))
    threads = [
        threading.Thread(target=_report, args=(cluster, name, events, errors, barrier))
        for name, events in per_node.items()
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.started_at is not None
    runs = RankRun.objects.filter(job=job, generation=job.generation)
    assert runs.count() == job.gpus
    assert {r.rank: r.pid for r in runs} == {r: 100 + r for r in range(job.gpus)}


def test_a_start_waits_for_no_other_start_but_for_a_state_change(cluster, user, tmp_path):
    """While another node's starts hold the job's lock shared, a start is recorded at once; while
    a change of state holds it (here a cancel), a start waits for it and then counts as stopping."""
    job = _placed(user, tmp_path)
    (first, first_events), (second, second_events), *_ = _starts(job).items()
    errors: list = []
    with transaction.atomic():
        # This connection's shared lock: another node's report in progress.
        agent_services._job_for_share(job.pk, cluster.pk)
        t = threading.Thread(target=_report, args=(cluster, first, first_events, errors))
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), "a start waited for another node's start"
    assert not errors
    assert RankRun.objects.filter(job=job, rank__in=[e.rank for e in first_events]).count() == len(
        first_events
    )

    done = threading.Event()

    def report_second():
        _report(cluster, second, second_events, errors)
        done.set()

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=job.pk)
        t = threading.Thread(target=report_second)
        t.start()
        assert not done.wait(1.0), "a start did not wait for the job's exclusive lock"
        services.job_cancel(job=Job.objects.get(pk=job.pk))
    t.join(timeout=10)
    assert done.is_set() and not errors
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    late = RankRun.objects.filter(job=job, rank__in=[e.rank for e in second_events])
    assert late.count() == len(second_events)
    assert all(r.stop_requested_at is not None for r in late)


def test_a_repeated_start_updates_its_pid_and_an_exited_rank_stays_exited(cluster, user, tmp_path):
    job = _placed(user, tmp_path)
    (name, events), *_ = _starts(job).items()
    errors: list = []
    _report(cluster, name, events[:2], errors)
    node = Node.objects.get(cluster=cluster, name=name)
    first, second = events[0].rank, events[1].rank
    exited = RankEvent(job.pk, job.generation, second, "exited", exit_code=0)
    assert agent_services.agent_report(node=node, reports=[exited]) == []
    again = [
        RankEvent(job.pk, job.generation, first, "started", pid=4242, log_tail="x" * 9000),
        RankEvent(job.pk, job.generation, second, "started", pid=4243),
        RankEvent(job.pk, job.generation, second, "started", pid=4244),
    ]
    _report(cluster, name, again, errors)
    assert not errors
    runs = {r.rank: r for r in RankRun.objects.filter(job=job)}
    assert runs[first].pid == 4242 and runs[first].state == "started"
    assert len(runs[first].log_tail) == 8192
    assert runs[second].state == "exited" and runs[second].pid == 100 + second
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING

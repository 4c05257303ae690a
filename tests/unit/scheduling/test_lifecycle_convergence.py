"""The lifecycle converges whatever an executor lost: a GPU is freed only at a confirmed exit (or
a fenced, down node), a ranks' exit is never lost to retention, and a job never runs two
generations at once. Driven through the agents' REST sync, without processes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.executors.agents import services as agents
from apps.scheduling import services
from apps.scheduling.choices import JobStatus, NodeState, RankState
from apps.scheduling.models import Allocation, NodeHealth, RankRun
from apps.scheduling.retention import scheduling_retain
from apps.scheduling.selectors import job_ranks
from apps.scheduling.snapshot import cluster_snapshot

from .test_agents_api import nodes, server_answering, submit, sync  # noqa: F401  (the `nodes` fixture)

pytestmark = pytest.mark.django_db


def start_all(nodes, job, committed) -> dict[int, str]:  # noqa: F811
    where = {r["rank"]: r["node"] for r in job_ranks(job=job)}
    for node in sorted(set(where.values())):
        started = [
            {"job": job.pk, "generation": job.generation, "rank": r, "event": "started", "pid": 100 + r}
            for r, n in where.items()
            if n == node
        ]
        committed(sync, nodes, node, reports=started)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    return where


def free(cluster) -> int:
    return int(cluster_snapshot(cluster=cluster).free.sum())


def test_a_failed_jobs_ranks_on_a_node_whose_agent_lost_them_are_freed_once_it_reports_them_gone(
    case44,
    nodes,  # noqa: F811
    alice,
    committed,
):
    job = submit(alice, committed, "two-nodes", 16)
    where = start_all(nodes, job, committed)
    failing = next(r for r, n in where.items() if n == "node-a")
    committed(
        sync,
        nodes,
        "node-a",
        reports=[{"job": job.pk, "generation": 1, "rank": failing, "event": "exited", "exit_code": 3}],
    )
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    # node-b's ranks have not exited: their GPUs stay booked, and node-b is told to stop them.
    on_b = sorted(r for r, n in where.items() if n == "node-b")
    assert Allocation.objects.filter(job=job, live=True, node_name="node-b").count() == 8
    # Its agent restarted without its state (its ranks were killed with it): it runs nothing.
    answer = sync(nodes, "node-b", running=[], stopping=[]).json()
    assert answer["work"] == []
    assert answer["stop"] == [[job.pk, 1, r] for r in on_b]
    assert set(
        RankRun.objects.filter(job=job, node__name="node-b").values_list("stop_requested_at", flat=True)
    ) != {None}
    # It reports each of them gone (what the agent answers a stop it has no trace of).
    gone = [{"job": job.pk, "generation": 1, "rank": r, "event": "exited", "exit_code": 255} for r in on_b]
    answer = committed(sync, nodes, "node-b", reports=gone).json()
    assert answer["stop"] == []
    assert not Allocation.objects.filter(job=job, live=True, node_name="node-b").exists()
    assert free(case44) == 9
    # node-a's agent stops the rest of the job's ranks there (not listed as work any more).
    on_a = sorted(r for r, n in where.items() if n == "node-a" and r != failing)
    answer = sync(nodes, "node-a", running=[[job.pk, 1, r] for r in on_a]).json()
    assert answer["work"] == [] and answer["stop"] == [[job.pk, 1, r] for r in on_a]
    stopped = [{"job": job.pk, "generation": 1, "rank": r, "event": "exited", "exit_code": -15} for r in on_a]
    committed(sync, nodes, "node-a", reports=stopped)
    assert not Allocation.objects.filter(job=job, live=True).exists()
    assert free(case44) == 16
    # A job needing both whole nodes now starts.
    big = submit(alice, committed, "both-nodes", 16)
    assert big.status == JobStatus.PLACING


def test_a_stop_the_agent_is_already_stopping_lets_its_poll_wait(
    case44,
    nodes,  # noqa: F811
    alice,
    committed,
    settings,
):
    settings.TOPOWEB_AGENT_POLL_S = 0.3
    job = submit(alice, committed, "j", 8)
    where = start_all(nodes, job, committed)
    node = next(iter(where.values()))
    committed(services.job_cancel, job=job)
    keys = [[job.pk, 1, r] for r in sorted(where)]
    # Not yet stopping on the agent's side: answered at once, naming what to stop.
    answer = sync(nodes, node, running=keys, stopping=[], wait_s=30).json()
    assert answer["stop"] == keys
    # Stopping already: nothing new for it, so the poll waits (up to the server's poll interval).
    t0 = timezone.now()
    answer = sync(nodes, node, running=[], stopping=keys, wait_s=30).json()
    assert (timezone.now() - t0).total_seconds() >= 0.25
    assert answer["stop"] == keys


def test_retention_keeps_the_early_exit_of_a_running_job_so_it_completes(
    case44,
    nodes,  # noqa: F811
    alice,
    committed,
    settings,
):
    settings.RETAIN_RANK_RECORDS_DAYS = 1
    job = submit(alice, committed, "long", 8)
    where = start_all(nodes, job, committed)
    node = next(iter(where.values()))
    committed(
        sync,
        nodes,
        node,
        reports=[{"job": job.pk, "generation": 1, "rank": 0, "event": "exited", "exit_code": 0}],
    )
    # Rank 0 finished its part long ago; the others still run.
    RankRun.objects.filter(job=job, rank=0).update(exited_at=timezone.now() - timedelta(days=3))
    scheduling_retain()
    assert RankRun.objects.filter(job=job, rank=0).exists()
    rest = [
        {"job": job.pk, "generation": 1, "rank": r, "event": "exited", "exit_code": 0}
        for r in sorted(where)
        if r
    ]
    committed(sync, nodes, node, reports=rest)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert free(case44) == 16
    # Once the job finished, its old records are retention's again.
    RankRun.objects.filter(job=job).update(exited_at=timezone.now() - timedelta(days=3))
    assert scheduling_retain()["rank_records"] == 8


def test_a_job_of_a_down_node_is_requeued_at_its_fence_deadline_and_placed_again(
    case44,
    nodes,  # noqa: F811
    alice,
    committed,
    settings,
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = 20
    job = submit(alice, committed, "j", 8, requeue=True)
    where = start_all(nodes, job, committed)
    node = next(iter(where.values()))
    other = ({"node-a", "node-b"} - {node}).pop()
    seen = timezone.now() - timedelta(seconds=31)
    NodeHealth.objects.filter(node__name=node).update(last_seen=seen)
    server_answering()
    assert committed(agents.nodes_check, cluster=case44)["down"] == [node]
    job.refresh_from_db()
    # Down, but its ranks on the cut-off node may still run until the agent fenced them (or it
    # comes back): the job runs on, nothing is placed on the other node meanwhile.
    assert job.status == JobStatus.RUNNING and job.generation == 1
    assert not Allocation.objects.filter(job=job, live=True, node_name=other).exists()
    # Before the deadline (last seen + down/2 + fence + slack + the stop grace + a margin)
    # nothing moves.
    grace = 30.0  # the default stop grace of the job spec
    slack = agents.fence_slack_s()
    assert slack == 20.0  # the 20 s lease (at most 30 s)
    deadline = seen + timedelta(seconds=15 + 20 + slack + grace + agents.FENCE_MARGIN_S)
    assert committed(agents.nodes_check, cluster=case44, now=deadline - timedelta(seconds=1))["fenced"] == []
    assert RankRun.objects.filter(job=job, state=RankState.STARTED).count() == 8
    # Past it, the fenced ranks count as gone and the job is requeued and placed again, on the
    # other node.
    assert committed(agents.nodes_check, cluster=case44, now=deadline)["fenced"] == [node]
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING and job.generation == 2
    assert job.requeue_reason == f"node {node} went down and its fence deadline passed"
    assert {r["node"] for r in job_ranks(job=job)} == {other}
    lost = RankRun.objects.filter(job=job, generation=1).values_list("state", "log_tail")
    assert {s for s, _ in lost} == {RankState.EXITED}
    assert all("fence deadline passed" in t for _, t in lost)


def test_an_agent_back_before_its_fence_deadline_confirms_its_ranks_exits_itself(
    case44,
    nodes,  # noqa: F811
    alice,
    committed,
    settings,
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "j", 8, requeue=True)
    where = start_all(nodes, job, committed)
    node = next(iter(where.values()))
    NodeHealth.objects.filter(node__name=node).update(last_seen=timezone.now() - timedelta(seconds=31))
    server_answering()
    committed(agents.nodes_check, cluster=case44)
    keys = [[job.pk, 1, r] for r in sorted(where)]
    # The agent is back, stopping ranks it fenced (a shorter lease of its own): the server still
    # counts them, so the node is up at once; the job is left to their exits.
    answer = committed(sync, nodes, node, running=[], stopping=keys).json()
    assert answer["state"] == NodeState.UP
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    # The agent's contact moves the deadline on: a check now frees nothing.
    assert committed(agents.nodes_check, cluster=case44)["fenced"] == []
    exits = [
        {"job": job.pk, "generation": 1, "rank": r, "event": "exited", "exit_code": -9} for r in sorted(where)
    ]
    committed(sync, nodes, node, reports=exits, running=[], stopping=[])
    job.refresh_from_db()
    # Its own exits, not "lost": the ranks' reports decide (a kill fails the job), GPUs are free.
    assert job.status == JobStatus.FAILED
    runs = RankRun.objects.filter(job=job).values_list("exit_code", flat=True)
    assert set(runs) == {-9}
    assert free(case44) == 16

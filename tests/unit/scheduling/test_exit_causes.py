"""Why a rank exited decides what happens to its job: the rank's own exit (or its limits, or a
refused start) fails it; a rank lost, fenced or stopped by a fault not its own requeues a
`requeue: true` job, at most `max_requeues` times."""

from __future__ import annotations

import pytest

from apps.executors.agents import selectors as agent_selectors
from apps.scheduling import lifecycle
from apps.scheduling.choices import ExitCause, JobStatus
from apps.scheduling.models import Job, RankRun
from apps.scheduling.selectors import job_rank_logs, job_ranks
from apps.topology.models import Node

from .test_agents_api import NodeClients, submit, sync

FENCE_NOTE = "fenced: the node agent had no contact with the server for 130 s"


@pytest.fixture
def nodes(case44) -> NodeClients:
    return NodeClients(case44)


@pytest.fixture(autouse=True)
def fresh_work_cache():
    """The work of a generation is cached per process by job id, which the next test's database
    may give another job: none is left behind."""
    agent_selectors._CACHE.clear()
    yield
    agent_selectors._CACHE.clear()


def start_all(nodes, committed, job: Job) -> dict[str, list[int]]:
    """Every rank of the job reported started by its node; the ranks per node."""
    per_node: dict[str, list[int]] = {}
    for r in job_ranks(job=job):
        per_node.setdefault(r["node"], []).append(r["rank"])
    for node, ranks in per_node.items():
        reports = [
            {"job": job.pk, "generation": job.generation, "rank": r, "event": "started"} for r in ranks
        ]
        assert committed(sync, nodes, node, reports=reports).status_code == 200
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    return per_node


def exit_one(nodes, committed, job: Job, node: str, rank: int, code: int, tail: str = "", **cause):
    report = {
        "job": job.pk,
        "generation": job.generation,
        "rank": rank,
        "event": "exited",
        "exit_code": code,
        "log_tail": tail,
        **cause,
    }
    answer = committed(sync, nodes, node, reports=[report])
    assert answer.status_code == 200 and answer.json()["refused"] == [], answer.json()
    job.refresh_from_db()


def test_a_fenced_rank_requeues_a_requeue_job_naming_the_cause(case44, nodes, alice, committed):
    job = submit(alice, committed, "j", 8, requeue=True)
    node, ranks = next(iter(start_all(nodes, committed, job).items()))
    exit_one(nodes, committed, job, node, ranks[3], -15, f"step 900\n{FENCE_NOTE}", cause="fenced")
    assert job.status in (JobStatus.QUEUED, JobStatus.PLACING), job.pending_reason
    assert job.requeues == 1 and job.preemptions == 0
    assert job.requeue_reason == (
        f"rank {ranks[3]} on node {node} was fenced: the node agent had no contact with the server for 130 s"
    )
    run = RankRun.objects.get(job=job, generation=1, rank=ranks[3])
    assert run.exit_cause == ExitCause.FENCED and run.exit_code == -15


def test_a_fenced_rank_fails_a_job_without_requeue(case44, nodes, alice, committed):
    job = submit(alice, committed, "j", 8)
    node, ranks = next(iter(start_all(nodes, committed, job).items()))
    exit_one(nodes, committed, job, node, ranks[0], -15, FENCE_NOTE, cause="fenced")
    assert job.status == JobStatus.FAILED and job.requeues == 0
    assert (
        job.pending_reason
        == f"rank {ranks[0]} on node {node} was fenced: the node agent had no contact with the server for 130 s"
    )


@pytest.mark.parametrize("cause", ["exited", None, "pids_limit", "memory_limit", "refused"])
def test_the_ranks_own_exit_fails_even_a_requeue_job(case44, nodes, alice, committed, cause):
    """None: an agent of before causes, which sends none (the rank's own exit)."""
    job = submit(alice, committed, "j", 8, requeue=True)
    node, ranks = next(iter(start_all(nodes, committed, job).items()))
    extra = {} if cause is None else {"cause": cause}
    exit_one(nodes, committed, job, node, ranks[1], 1, "Traceback: boom", **extra)
    assert job.status == JobStatus.FAILED and job.requeues == 0
    assert job.pending_reason.startswith(f"rank {ranks[1]} on node {node} ")
    assert "Traceback: boom" in job.pending_reason
    run = RankRun.objects.get(job=job, generation=1, rank=ranks[1])
    assert run.exit_cause == (cause or "exited")
    if cause == "pids_limit":
        assert "limit of processes and threads (pids_max)" in job.pending_reason
    if cause == "memory_limit":
        assert "OOM killer" in job.pending_reason and "memory_mb" in job.pending_reason


def test_a_lost_rank_that_reported_0_does_not_complete_its_job(case44, nodes, alice, committed):
    """Exit code 0 from a rank its agent lost track of (or fenced: a SIGTERM handler exiting 0)
    is no completion: a job whose every rank did that is interrupted, not completed."""
    job = submit(alice, committed, "j", 8)
    per_node = start_all(nodes, committed, job)
    node, ranks = next(iter(per_node.items()))
    exit_one(
        nodes,
        committed,
        job,
        node,
        ranks[0],
        0,
        "lost: its shim was killed; exit status unknown",
        cause="lost",
    )
    assert job.status == JobStatus.FAILED
    assert (
        job.pending_reason
        == f"rank {ranks[0]} on node {node} was lost: its shim was killed; exit status unknown"
    )


def test_past_its_max_requeues_a_job_fails_saying_so(case44, nodes, alice, committed):
    job = submit(alice, committed, "j", 8, requeue=True, max_requeues=2)
    Job.objects.filter(pk=job.pk).update(requeues=2)
    node, ranks = next(iter(start_all(nodes, committed, job).items()))
    exit_one(nodes, committed, job, node, ranks[0], 255, "lost: the node agent lost its state", cause="lost")
    assert job.status == JobStatus.FAILED and job.requeues == 2
    assert job.pending_reason == (
        f"rank {ranks[0]} on node {node} was lost: the node agent lost its state;"
        " not requeued: it was requeued 2 times already, its max_requeues is 2"
    )


def test_max_requeues_0_never_requeues(case44, nodes, alice, committed):
    job = submit(alice, committed, "j", 8, requeue=True, max_requeues=0)
    node, ranks = next(iter(start_all(nodes, committed, job).items()))
    exit_one(nodes, committed, job, node, ranks[0], -15, FENCE_NOTE, cause="fenced")
    assert job.status == JobStatus.FAILED and "its max_requeues is 0" in job.pending_reason


def test_a_down_node_honours_the_same_limit(case44, nodes, alice, committed):
    job = submit(alice, committed, "j", 8, requeue=True, max_requeues=1)
    node = next(iter(start_all(nodes, committed, job)))
    committed(lifecycle.ranks_lost, node=Node.objects.get(cluster=case44, name=node), why="lost: gone")
    job.refresh_from_db()
    assert job.requeues == 1 and job.status != JobStatus.FAILED
    assert set(RankRun.objects.filter(job=job, generation=1).values_list("exit_cause", flat=True)) == {
        "node_down"
    }
    # The second time it is past its limit.
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING and job.generation == 2
    node = next(iter(start_all(nodes, committed, job)))
    committed(lifecycle.ranks_lost, node=Node.objects.get(cluster=case44, name=node), why="lost: gone")
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "its max_requeues is 1" in job.pending_reason


def test_an_unknown_cause_is_refused_naming_the_field(case44, nodes, alice, committed):
    job = submit(alice, committed, "j", 8)
    node, ranks = next(iter(start_all(nodes, committed, job).items()))
    for cause in ("meteor", "node_down", 3):
        report = {
            "job": job.pk,
            "generation": 1,
            "rank": ranks[0],
            "event": "exited",
            "exit_code": 1,
            "cause": cause,
        }
        (refused,) = committed(sync, nodes, node, reports=[report]).json()["refused"]
        assert refused["reason"].startswith("cause:")
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_the_failing_rank_is_listed_before_those_topoweb_stopped(case44, nodes, alice, alice_api, committed):
    job = submit(alice, committed, "j", 8)
    node, ranks = next(iter(start_all(nodes, committed, job).items()))
    exit_one(nodes, committed, job, node, ranks[5], 3, "oops")
    assert job.status == JobStatus.FAILED
    for r in ranks[:2]:
        exit_one(nodes, committed, job, node, r, -15, "", cause="stopped")
    page = job_rank_logs(job=job)
    assert [(r.rank, r.exit_cause) for r in page.runs[:3]] == [
        (ranks[5], "exited"),
        (ranks[0], "stopped"),
        (ranks[1], "stopped"),
    ]
    rows = alice_api.get(f"/api/v1/jobs/{job.pk}/logs/").json()
    causes = {row["rank"]: row["exit_cause"] for row in rows}
    assert causes[ranks[5]] == "exited" and causes[ranks[0]] == "stopped" and causes[ranks[2]] is None


def test_the_job_page_shows_the_cause(case44, nodes, alice, committed, client):
    job = submit(alice, committed, "j", 8, requeue=True, max_requeues=0)
    node, ranks = next(iter(start_all(nodes, committed, job).items()))
    exit_one(nodes, committed, job, node, ranks[0], -15, FENCE_NOTE, cause="fenced")
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'class="badge badge-fenced"' in html and ">fenced</span>" in html
    assert "was fenced: the node agent had no contact" in html


def test_the_work_carries_the_jobs_limits(case44, nodes, alice, committed):
    job = submit(alice, committed, "j", 8, pids_max=256, memory_mb=2048)
    node = job_ranks(job=job)[0]["node"]
    (work,) = sync(nodes, node).json()["work"]
    assert work["pids_max"] == 256 and work["memory_mb"] == 2048
    other = submit(alice, committed, "k", 8)
    (work,) = [w for w in sync(nodes, job_ranks(job=other)[0]["node"]).json()["work"] if w["job"] == other.pk]
    assert work["pids_max"] is None and work["memory_mb"] is None


def test_the_agent_and_the_server_name_the_same_causes():
    """The agent (no Django) keeps its own copy of the causes it reports; the server knows each,
    and one more of its own (node_down)."""
    from apps.agent import runner

    assert set(runner.CAUSES) | {ExitCause.NODE_DOWN} == set(ExitCause.values)

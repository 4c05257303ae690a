"""The agents' REST side without processes: sync validation and scope, reports driving the job,
unhealthy GPUs, drain and resume, the start timeout, job logs."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from apps.scheduling import agents, services, wakeups
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.models import Allocation, Job, NodeAgent, RankRun
from apps.scheduling.selectors import job_ranks
from apps.scheduling.snapshot import cluster_snapshot
from apps.topology.models import Node

from .conftest import small_spec

COMMAND = ["python", "-c", "pass"]


@pytest.fixture
def launcher(case44) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Launcher {services.launcher_token_create(cluster=case44).key}")
    return client


def sync(client: APIClient, node: str = "node-a", **body):
    return client.post("/api/v1/agents/sync/", {"node": node, "version": "1.0.0", **body}, format="json")


def submit(user, committed, name: str, gpus: int, **extra) -> Job:
    job = committed(services.job_submit, user=user, spec=small_spec(name, gpus, command=COMMAND, **extra))
    job.refresh_from_db()
    return job


def test_sync_registers_the_node_and_hands_out_its_ranks(launcher, alice, committed):
    job = submit(alice, committed, "j", 16)
    body = sync(launcher).json()
    assert body["state"] == "up"
    (work,) = body["work"]
    assert work["job"] == job.pk and work["generation"] == 1 and work["world_size"] == 16
    assert work["command"] == COMMAND
    assert len(work["ranks"]) == 8 and all(r["node"] == "node-a" for r in work["ranks"])
    assert NodeAgent.objects.get(node__name="node-a").last_seen is not None


def test_reports_move_the_job_running_then_completed(launcher, alice, committed):
    job = submit(alice, committed, "j", 16)
    for node in ("node-a", "node-b"):
        ranks = [r["rank"] for r in sync(launcher, node).json()["work"][0]["ranks"]]
        reports = [
            {"job": job.pk, "generation": 1, "rank": r, "event": "started", "pid": 100 + r} for r in ranks
        ]
        committed(sync, launcher, node, reports=reports)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.started_at is not None
    exits = [
        {"job": job.pk, "generation": 1, "rank": r, "event": "exited", "exit_code": 0} for r in range(16)
    ]
    committed(sync, launcher, "node-a", reports=exits)
    committed(sync, launcher, "node-a", reports=exits)  # a retried report is harmless
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert not Allocation.objects.filter(job=job, live=True).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"node": "no-such-node"}, "node"),
        ({"node": "node-a; rm"}, "node"),
        ({"wait_s": 1e9}, "wait_s"),
        ({"reports": [{"job": 1, "generation": 1, "rank": 0, "event": "exited"}]}, "reports"),
        ({"reports": [{"job": 1, "generation": 1, "rank": -1, "event": "started"}]}, "reports"),
        ({"unhealthy": [{"gpu": 999, "reason": "xid"}]}, "unhealthy"),
        ({"running": [[1, 2]]}, "running"),
        ({"reports": [{"job": 1, "generation": 1, "rank": 0, "event": "started"}] * 2000}, "reports"),
    ],
)
def test_bad_sync_bodies_are_400_naming_the_field(launcher, body, field):
    response = sync(launcher, **body)
    assert response.status_code == 400
    assert field in response.json()


def test_an_idle_poll_reads_the_agent_row_and_the_work_and_writes_nothing(launcher, case44, settings):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    gpus = [{"index": i, "uuid": f"GPU-{i}", "name": "A100"} for i in range(8)]
    first = sync(launcher, gpus=gpus, addr="10.0.0.1")
    assert first.status_code == 200 and first.json()["work"] == []
    with CaptureQueriesContext(connection) as queries:
        again = sync(launcher, gpus=gpus, addr="10.0.0.1")
    assert again.status_code == 200 and again.json()["state"] == "up"
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    # The agent row and the node's work (the node and its GPU indexes are remembered).
    assert statements == ["SELECT"] * 2, statements
    # Something new (an unhealthy GPU) is written at once, and so is a heartbeat due again.
    sync(launcher, gpus=gpus, addr="10.0.0.1", unhealthy=[{"gpu": 1, "reason": "XID 79"}])
    assert NodeAgent.objects.get(node__name="node-a").unhealthy_gpus == [{"gpu": 1, "reason": "XID 79"}]
    old = timezone.now() - timedelta(seconds=16)
    NodeAgent.objects.filter(node__name="node-a").update(last_seen=old)
    sync(launcher, gpus=gpus, addr="10.0.0.1", unhealthy=[{"gpu": 1, "reason": "XID 79"}])
    assert NodeAgent.objects.get(node__name="node-a").last_seen > old


def test_a_node_deleted_after_its_agent_synced_is_refused(launcher, case44):
    assert sync(launcher, "node-b").status_code == 200
    Node.objects.filter(cluster=case44, name="node-b").delete()
    response = sync(launcher, "node-b")
    assert response.status_code == 400 and "node" in response.json()


def test_only_a_launcher_token_may_sync(alice_api, case44):
    assert alice_api.post(
        "/api/v1/agents/sync/", {"node": "node-a", "version": "1"}, format="json"
    ).status_code in (
        401,
        403,
    )


def test_an_unhealthy_gpu_leaves_the_free_set_until_resumed(launcher, case44, staff_api):
    committed_sync = sync(launcher, unhealthy=[{"gpu": 3, "reason": "XID 79"}])
    assert committed_sync.status_code == 200
    snap = cluster_snapshot(cluster=case44)
    assert int(snap.free.sum()) == 15 and not snap.free[snap.topology.gid("node-a", 3)]
    node = Node.objects.get(cluster=case44, name="node-a")
    health = staff_api.get("/api/v1/node-health/", {"cluster": "case-4-4", "node": "node-a"}).json()
    assert health["results"][0]["unhealthy_gpus"] == [{"gpu": 3, "reason": "XID 79"}]
    assert staff_api.post(f"/api/v1/node-health/{node.pk}/resume/").status_code == 200
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 16


def test_a_gpu_missing_from_nvidia_smi_is_unhealthy(launcher, case44):
    gpus = [{"index": i, "uuid": f"GPU-{i}", "name": "A100"} for i in range(8) if i != 5]
    assert sync(launcher, gpus=gpus).status_code == 200
    assert NodeAgent.objects.get(node__name="node-a").unhealthy_gpus == [
        {"gpu": 5, "reason": "not found by nvidia-smi"}
    ]


def test_drain_takes_no_new_placements_and_resume_returns_the_node(case44, staff_api, alice, committed):
    node = Node.objects.get(cluster=case44, name="node-a")
    response = staff_api.post(f"/api/v1/node-health/{node.pk}/drain/", {"reason": "firmware"}, format="json")
    assert response.status_code == 200 and response.json()["state"] == NodeState.DRAINED
    job = submit(alice, committed, "j8", 8)
    assert {r["node"] for r in job_ranks(job=job)} == {"node-b"}
    big = submit(alice, committed, "j16", 8)
    assert big.status == JobStatus.QUEUED
    committed(staff_api.post, f"/api/v1/node-health/{node.pk}/resume/")
    big.refresh_from_db()
    assert big.status == JobStatus.PLACING


def test_drain_needs_staff_and_a_reason(case44, alice_api, staff_api):
    node = Node.objects.get(cluster=case44, name="node-a")
    assert (
        alice_api.post(f"/api/v1/node-health/{node.pk}/drain/", {"reason": "x"}, format="json").status_code
        == 403
    )
    response = staff_api.post(f"/api/v1/node-health/{node.pk}/drain/", {}, format="json")
    assert response.status_code == 400 and "reason" in response.json()


def test_a_job_whose_ranks_never_start_is_requeued_with_its_gpus_released(case44, alice, committed, settings):
    settings.TOPOWEB_START_TIMEOUT_S = 60
    job = submit(alice, committed, "stuck", 16)
    assert job.status == JobStatus.PLACING
    Job.objects.filter(pk=job.pk).update(placed_at=timezone.now() - timedelta(seconds=61))
    changed = agents.nodes_check(cluster=case44)
    assert changed["requeued"] == [job.pk]
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert "0 of 16 ranks started within the start timeout of 60 s" in job.pending_reason
    assert not Allocation.objects.filter(job=job, live=True).exists()


def test_the_requeue_reason_outlives_the_next_cycles_pending_reason(
    case44, alice, alice_api, committed, settings, client
):
    settings.TOPOWEB_START_TIMEOUT_S = 60
    job = submit(alice, committed, "stuck", 16)
    blocker = submit(alice, committed, "behind", 8, priority=5)
    assert blocker.status == JobStatus.QUEUED
    Job.objects.filter(pk=job.pk).update(placed_at=timezone.now() - timedelta(seconds=61))
    # The release runs a cycle at once: the higher-priority job takes half the GPUs and the
    # requeued one waits for the rest, with a new pending reason.
    assert committed(agents.nodes_check, cluster=case44)["requeued"] == [job.pk]
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert "start timeout" not in job.pending_reason
    assert job.requeue_reason == "0 of 16 ranks started within the start timeout of 60 s"
    assert job.requeued_at is not None
    body = alice_api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["requeue_reason"] == job.requeue_reason and body["requeued_at"]
    listed = alice_api.get("/api/v1/jobs/", {"status": "queued"}).json()["results"]
    assert [j["requeue_reason"] for j in listed if j["id"] == job.pk] == [job.requeue_reason]
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="requeue-reason"' in page and "0 of 16 ranks started" in page


def test_a_requeued_job_of_a_down_node_says_why_after_it_is_placed_again(
    case44, launcher, alice, committed, settings
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "again", 8, requeue=True)
    node = job_ranks(job=job)[0]["node"]
    sync(launcher, node)
    NodeAgent.objects.filter(node__name=node).update(last_seen=timezone.now() - timedelta(seconds=31))
    committed(agents.nodes_check, cluster=case44)
    job.refresh_from_db()
    # Placed again on the other node by the cycle the release queued: nothing waits any more.
    assert job.status == JobStatus.PLACING and job.pending_reason == ""
    assert {r["node"] for r in job_ranks(job=job)} != {node}
    assert job.requeue_reason.startswith(f"node {node} went down")


def live_gpus(job: Job) -> set[int]:
    return set(Allocation.objects.filter(job=job, live=True).values_list("gpu_id", flat=True))


def test_preempting_an_agent_run_job_waits_until_every_rank_exited(case44, launcher, alice, bob, committed):
    case44.preemption_enabled = True
    case44.save()
    low = submit(bob, committed, "low", 16)
    started = [
        {"job": low.pk, "generation": 1, "rank": r, "event": "started", "pid": 100 + r} for r in range(16)
    ]
    committed(sync, launcher, "node-a", reports=started)
    low.refresh_from_db()
    assert low.status == JobStatus.RUNNING
    high = submit(alice, committed, "high", 8, priority=5)
    low.refresh_from_db()
    # Phase one: the victim stops; its 16 GPUs stay allocated and the preemptor waits.
    assert low.status == JobStatus.PREEMPTED and "its ranks are stopping" in low.pending_reason
    assert high.status == JobStatus.QUEUED
    assert high.pending_reason.startswith(f"preempting job {low.pk}: waiting for its ranks to exit")
    assert len(live_gpus(low)) == 16 and not live_gpus(high)
    # Its agents no longer see it as work: they SIGTERM its ranks.
    for node in ("node-a", "node-b"):
        assert all(w["job"] != low.pk for w in sync(launcher, node).json()["work"])
    # Ranks exit one node at a time; each exit frees its GPU, never to anyone else meanwhile.
    for rank in range(15):
        exited = {"job": low.pk, "generation": 1, "rank": rank, "event": "exited", "exit_code": -15}
        committed(sync, launcher, "node-a", reports=[exited])
        high.refresh_from_db()
        if high.status == JobStatus.PLACING:
            break
        assert not live_gpus(high)
        assert Allocation.objects.filter(live=True).count() == 16 - rank - 1
    # The preemptor is placed as soon as 8 of the victim's GPUs (a whole node here) are free.
    high.refresh_from_db()
    assert high.status == JobStatus.PLACING
    assert not live_gpus(high) & live_gpus(low)
    still = Allocation.objects.filter(job=low, live=True).values_list("rank", flat=True)
    assert still and all(not RankRun.objects.get(job=low, rank=r).exited_at for r in still)


def test_a_preempted_job_placed_again_frees_its_old_gpus_as_old_ranks_exit(
    case44, launcher, alice, bob, committed
):
    case44.preemption_enabled = True
    case44.save()
    low = submit(bob, committed, "low", 8)
    old_node = job_ranks(job=low)[0]["node"]
    started = [
        {"job": low.pk, "generation": 1, "rank": r, "event": "started", "pid": 100 + r} for r in range(8)
    ]
    committed(sync, launcher, old_node, reports=started)
    high = submit(alice, committed, "high", 16, priority=5)
    low.refresh_from_db()
    assert low.status == JobStatus.PREEMPTED and high.status == JobStatus.QUEUED
    # The preemptor goes away before the victim's ranks exited: the victim is placed again on
    # the other node while its old ranks still stop on the first.
    committed(services.job_cancel, job=high)
    low.refresh_from_db()
    assert low.status == JobStatus.PLACING and low.generation == 2
    assert {r["node"] for r in job_ranks(job=low)} == {"node-a", "node-b"} - {old_node}
    assert Allocation.objects.filter(job=low, live=True, generation=1).count() == 8
    exits = [
        {"job": low.pk, "generation": 1, "rank": r, "event": "exited", "exit_code": -15} for r in range(8)
    ]
    committed(sync, launcher, old_node, reports=exits)
    assert not Allocation.objects.filter(job=low, live=True, generation=1).exists()
    assert Allocation.objects.filter(job=low, live=True, generation=2).count() == 8


def test_a_silent_node_goes_down_and_its_job_fails(case44, launcher, alice, committed, settings):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "j", 8)
    node = job_ranks(job=job)[0]["node"]
    sync(launcher, node)
    NodeAgent.objects.filter(node__name=node).update(last_seen=timezone.now() - timedelta(seconds=31))
    assert committed(agents.nodes_check, cluster=case44)["down"] == [node]
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and f"node {node} went down" in job.pending_reason
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 8
    sync(launcher, node)
    assert NodeAgent.objects.get(node__name=node).state == NodeState.UP


def test_job_logs_show_each_ranks_output_tail(launcher, alice, alice_api, bob_api, committed):
    job = submit(alice, committed, "j", 2, estimated_runtime_s=60)
    reports = [
        {"job": job.pk, "generation": 1, "rank": 0, "event": "started", "pid": 10, "log_tail": "step 1\n"},
        {"job": job.pk, "generation": 1, "rank": 1, "event": "exited", "exit_code": 2, "log_tail": "oops\n"},
    ]
    committed(sync, launcher, job_ranks(job=job)[0]["node"], reports=reports)
    logs = alice_api.get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert [(r["rank"], r["log_tail"]) for r in logs] == [(0, "step 1\n"), (1, "oops\n")]
    assert bob_api.get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 404
    assert alice_api.get(f"/api/v1/jobs/{job.pk}/logs/", {"rank": "x"}).status_code == 400
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "rank 1" in job.pending_reason and "oops" in job.pending_reason


def test_malformed_or_own_wakeups_change_nothing():
    before = wakeups.epoch(424243, "node-z")
    wakeups._apply(b"not json")
    wakeups._apply(json.dumps({"origin": wakeups._ORIGIN, "cluster": 424243, "nodes": ["node-z"]}))
    wakeups._apply(json.dumps({"origin": "x", "nodes": ["node-z"]}))
    assert wakeups.epoch(424243, "node-z") == before


def test_the_server_bounds_a_poll_by_its_own_interval(launcher, settings):
    settings.TOPOWEB_AGENT_POLL_S = 0.3
    sync(launcher)
    started = time.monotonic()
    body = sync(launcher, wait_s=30).json()
    # Nothing changed for the node: the poll waited, but the server's 0.3 s, not the asked 30 s.
    assert 0.25 <= time.monotonic() - started < 10
    assert body["work"] == [] and body["poll_s"] == 0.3 and body["down_after_s"] == agents.down_after_s()


@pytest.mark.django_db(transaction=True)
def test_a_sync_that_loses_the_write_lock_is_retried_not_refused(launcher, alice, monkeypatch):
    """On the embedded SQLite a heartbeat or a report that meets "database is locked" is written
    again after a short wait instead of answering the agent 503."""
    from django.db import OperationalError

    job = services.job_submit(user=alice, spec=small_spec("j", 16, command=COMMAND))
    calls = {"beat": 0, "report": 0}

    def locked_once(name, real):
        def wrapper(**kwargs):
            calls[name] += 1
            if calls[name] == 1:
                raise OperationalError("database is locked")
            return real(**kwargs)

        return wrapper

    monkeypatch.setattr(agents, "agent_heartbeat", locked_once("beat", agents.agent_heartbeat))
    monkeypatch.setattr(agents, "agent_report", locked_once("report", agents.agent_report))
    report = {"job": job.pk, "generation": 1, "rank": 0, "event": "started", "pid": 100}
    answer = sync(launcher, reports=[report])
    assert answer.status_code == 200, answer.content
    assert calls == {"beat": 2, "report": 2}
    assert RankRun.objects.get(job=job, rank=0).pid == 100

"""The agents' REST side without processes: sync validation and scope, reports driving the job,
unhealthy GPUs, drain and resume, the start timeout, job logs."""

from __future__ import annotations

import asyncio
import io
import json
import time
import types
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from apps.executors.agents import selectors as agent_selectors
from apps.executors.agents import services as agents
from apps.executors.agents import wakeups
from apps.scheduling import services
from apps.scheduling import snapshot as snap
from apps.scheduling.api.authentication import NodeAuthentication, node_tokens_forget
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.models import Allocation, Job, NodeHealth, NodeToken, RankRun, SyncPulse
from apps.scheduling.selectors import job_ranks, rendezvous_addrs
from apps.scheduling.snapshot import cluster_snapshot
from apps.topology.models import Node

from .conftest import small_spec

COMMAND = ["python", "-c", "pass"]


class NodeClients:
    """An API client per node of a cluster, each with that node's own agent token."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.clients: dict[str, APIClient] = {}

    def __getitem__(self, node: str) -> APIClient:
        if node not in self.clients:
            found = Node.objects.filter(cluster=self.cluster, name=node).first()
            # A node that does not exist gets a client with another node's credential.
            found = found or Node.objects.filter(cluster=self.cluster).first()
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Node {agents.node_token_create(node=found)[1]}")
            self.clients[node] = client
        return self.clients[node]


@pytest.fixture
def nodes(case44) -> NodeClients:
    return NodeClients(case44)


def sync(clients: NodeClients, node: str = "node-a", **body):
    return clients[node].post(
        "/api/v1/agents/sync/", {"node": node, "version": "1.0.0", **body}, format="json"
    )


def server_answering(seconds: float = 600.0) -> None:
    """The sync endpoint has been answering (some node) without a break for `seconds`."""
    now = timezone.now()
    SyncPulse.objects.update_or_create(
        pk=1, defaults={"answered_at": now, "back_at": now - timedelta(seconds=seconds)}
    )


def fence_deadline_of(node: str, grace_s: float = 30.0):
    """When the server counts `node`'s ranks gone (default stop grace of the test specs)."""
    seen = NodeHealth.objects.get(node__name=node).last_seen
    return agents.fence_deadline(last_seen=seen, grace_s=grace_s)


def submit(user, committed, name: str, gpus: int, **extra) -> Job:
    job = committed(services.job_submit, user=user, spec=small_spec(name, gpus, command=COMMAND, **extra))
    job.refresh_from_db()
    return job


def test_sync_registers_the_node_and_hands_out_its_ranks(nodes, alice, committed):
    job = submit(alice, committed, "j", 16)
    body = sync(nodes).json()
    assert body["state"] == "up"
    (work,) = body["work"]
    assert work["job"] == job.pk and work["generation"] == 1 and work["world_size"] == 16
    assert work["command"] == COMMAND
    assert len(work["ranks"]) == 8 and all(r["node"] == "node-a" for r in work["ranks"])
    assert NodeHealth.objects.get(node__name="node-a").last_seen is not None


def test_reports_move_the_job_running_then_completed(nodes, alice, committed):
    job = submit(alice, committed, "j", 16)
    for node in ("node-a", "node-b"):
        ranks = [r["rank"] for r in sync(nodes, node).json()["work"][0]["ranks"]]
        reports = [
            {"job": job.pk, "generation": 1, "rank": r, "event": "started", "pid": 100 + r} for r in ranks
        ]
        committed(sync, nodes, node, reports=reports)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.started_at is not None
    for node in ("node-a", "node-b"):
        exits = [
            {"job": job.pk, "generation": 1, "rank": r["rank"], "event": "exited", "exit_code": 0}
            for r in job_ranks(job=job)
            if r["node"] == node
        ]
        committed(sync, nodes, node, reports=exits)
        committed(sync, nodes, node, reports=exits)  # a retried report is harmless
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert not Allocation.objects.filter(job=job, live=True).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"node": "node-a; rm"}, "node"),
        ({"wait_s": 1e9}, "wait_s"),
        ({"unhealthy": [{"gpu": 999, "reason": "xid"}]}, "unhealthy"),
        ({"running": [[1, 2]]}, "running"),
        ({"reports": "all of them"}, "reports"),
        ({"reports": [{"job": 1, "generation": 1, "rank": 0, "event": "started"}] * 257}, "reports"),
    ],
)
def test_bad_sync_bodies_are_400_naming_the_field(nodes, body, field):
    response = sync(nodes, **body)
    assert response.status_code == 400
    assert field in response.json()


def test_an_idle_poll_reads_the_agent_row_and_the_work_and_writes_nothing(nodes, case44, settings):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    gpus = [{"index": i, "uuid": f"GPU-{i}", "name": "A100"} for i in range(8)]
    first = sync(nodes, gpus=gpus, addr="10.0.0.1")
    assert first.status_code == 200 and first.json()["work"] == []
    with CaptureQueriesContext(connection) as queries:
        again = sync(nodes, gpus=gpus, addr="10.0.0.1")
    assert again.status_code == 200 and again.json()["state"] == "up"
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    # The agent row and the node's work (the node and its GPU indexes are remembered).
    assert statements == ["SELECT"] * 2, statements
    # Something new (an unhealthy GPU) is written at once, and so is a heartbeat due again.
    sync(nodes, gpus=gpus, addr="10.0.0.1", unhealthy=[{"gpu": 1, "reason": "XID 79"}])
    assert NodeHealth.objects.get(node__name="node-a").unhealthy_gpus == [{"gpu": 1, "reason": "XID 79"}]
    old = timezone.now() - timedelta(seconds=16)
    NodeHealth.objects.filter(node__name="node-a").update(last_seen=old)
    sync(nodes, gpus=gpus, addr="10.0.0.1", unhealthy=[{"gpu": 1, "reason": "XID 79"}])
    assert NodeHealth.objects.get(node__name="node-a").last_seen > old


def test_the_node_and_its_agent_row_are_read_in_one_statement_and_a_deleted_node_is_refused(nodes, case44):
    gpus = [{"index": i, "uuid": f"GPU-{i}", "name": "A100"} for i in range(8)]
    assert sync(nodes, gpus=gpus, addr="10.0.0.1").status_code == 200
    with CaptureQueriesContext(connection) as queries:
        answer = sync(nodes, gpus=gpus, addr="10.0.0.1")
    assert answer.status_code == 200
    reads = [q["sql"] for q in queries.captured_queries if 'FROM "topology_node"' in q["sql"]]
    assert len(reads) == 1 and '"scheduling_nodeagent"' in reads[0], reads
    # The row read so comes back as the ORM would read it (JSON, dates), and the answer with it.
    agent = NodeHealth.objects.get(node__name="node-a")
    assert agent.inventory == gpus and agent.last_seen is not None
    assert answer.json()["cluster"] == case44.name and answer.json()["server_id"]
    Node.objects.filter(cluster=case44, name="node-a").update(name="node-a2")
    assert sync(nodes).status_code == 403
    Node.objects.filter(cluster=case44, name="node-a2").delete()
    assert sync(nodes).status_code in (401, 403)


def test_the_asgi_path_answers_at_once_with_the_wait_attached_then_the_changed_work(case44, monkeypatch):
    from django.db import OperationalError
    from django.test import RequestFactory

    from apps.executors.agents.api import views
    from topoweb.agents_asgi import AgentSyncApplication, _send

    key = agents.node_token_create(node=Node.objects.get(cluster=case44, name="node-a"))[1]
    app = AgentSyncApplication(site=None)

    def served():
        body = {"node": "node-a", "version": "1.0", "wait_s": 60}
        request = RequestFactory().post(
            "/api/v1/agents/sync/", body, content_type="application/json", HTTP_AUTHORIZATION=f"Node {key}"
        )
        setattr(request, views.WAITS_ELSEWHERE, True)
        return request, app.handler.get_response(request)

    # The view does not block its thread: it answers the current work with the wait attached.
    request, response = served()
    assert response.status_code == 200 and json.loads(response.content)["work"] == []
    assert response.agent_wait.wait_s == 60 and response.agent_wait.node.name == "node-a"
    other_request, other = served()
    # Once woken, the work is read again and the answer rendered anew (its length too).
    work = [{"job": 7, "generation": 1, "ranks": [{"rank": 0}]}]
    monkeypatch.setattr(views, "node_work", lambda node: (work, []))
    refreshed = app.refresh(request, response.agent_wait, response)
    assert json.loads(refreshed.content)["work"] == work
    # What the server sends: the new content with its own length.
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(_send(refreshed, send))
    headers = dict(sent[0]["headers"])
    assert sent[1]["body"] == refreshed.content
    assert int(headers[b"Content-Length"]) == len(refreshed.content)
    assert [k for k, _ in sent[0]["headers"] if k.lower() == b"content-length"] == [b"Content-Length"]

    # A database lost meanwhile is answered as the view's own error would be: 503, Retry-After.
    def lost(node):
        raise OperationalError("connection refused")

    monkeypatch.setattr(views, "node_work", lost)
    failed = app.refresh(other_request, other.agent_wait, other)
    assert failed.status_code == 503 and failed.has_header("Retry-After")


COUNTED: list[str] = []


def counting_middleware(get_response):
    """A middleware the site might add: it records the paths it saw (COUNTED)."""

    def middleware(request):
        COUNTED.append(request.path)
        return get_response(request)

    return middleware


def test_the_asgi_sync_skips_the_middleware_of_browsers_only(case44, settings):
    """An agent's sync passes the site's middleware but what serves browsers (sessions, CSRF,
    static files...); a middleware the site adds runs for it too, and the site keeps its list."""
    from django.test import RequestFactory

    from topoweb.agents_asgi import BROWSER_ONLY_MIDDLEWARE, AgentSyncApplication

    assert BROWSER_ONLY_MIDDLEWARE < set(settings.MIDDLEWARE)
    COUNTED.clear()
    site = [*settings.MIDDLEWARE, f"{__name__}.{counting_middleware.__name__}"]
    settings.MIDDLEWARE = site
    app = AgentSyncApplication(site=None)
    assert settings.MIDDLEWARE == site
    key = agents.node_token_create(node=Node.objects.get(cluster=case44, name="node-a"))[1]
    request = RequestFactory().post(
        "/api/v1/agents/sync/",
        {"node": "node-a", "version": "1.0"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Node {key}",
    )
    response = app.handler.get_response(request)
    assert response.status_code == 200 and COUNTED == ["/api/v1/agents/sync/"]
    # No session, no CSRF cookie, no page headers: none of the browser-only middleware ran.
    assert not response.cookies and not hasattr(request, "session")
    assert not response.has_header("X-Frame-Options") and not response.has_header("Content-Security-Policy")
    # The site's own middleware still does (the security headers of every answer).
    assert response["X-Content-Type-Options"] == "nosniff"


def test_a_node_deleted_after_its_agent_synced_is_refused(nodes, case44):
    assert sync(nodes, "node-b").status_code == 200
    Node.objects.filter(cluster=case44, name="node-b").delete()
    response = sync(nodes, "node-b")
    assert response.status_code in (401, 403)
    assert NodeHealth.objects.filter(node__name="node-b").count() == 0


def test_only_a_node_token_may_sync(alice_api, case44):
    body = {"node": "node-a", "version": "1"}
    assert alice_api.post("/api/v1/agents/sync/", body, format="json").status_code in (401, 403)
    launcher = APIClient()
    launcher.credentials(HTTP_AUTHORIZATION=f"Launcher {services.launcher_token_create(cluster=case44)[1]}")
    assert launcher.post("/api/v1/agents/sync/", body, format="json").status_code in (401, 403)
    assert not NodeHealth.objects.exists()


def test_the_launcher_token_keeps_only_the_launcher_calls(case44, alice, committed):
    job = submit(alice, committed, "j", 2)
    launcher = APIClient()
    launcher.credentials(HTTP_AUTHORIZATION=f"Launcher {services.launcher_token_create(cluster=case44)[1]}")
    assert launcher.get(f"/api/v1/jobs/{job.pk}/logs/").status_code in (401, 403)
    assert launcher.get(f"/api/v1/jobs/{job.pk}/rankmap/").status_code == 200
    assert launcher.get(f"/api/v1/jobs/{job.pk}/placement/").status_code == 200
    assert launcher.post(f"/api/v1/jobs/{job.pk}/start/").status_code == 200


def test_a_node_credential_cannot_sync_for_another_node(nodes, alice, committed):
    job = submit(alice, committed, "j", 16)
    response = nodes["node-b"].post(
        "/api/v1/agents/sync/", {"node": "node-a", "version": "1.0.0"}, format="json"
    )
    assert response.status_code == 403 and "node-b" in response.json()["detail"]
    assert not NodeHealth.objects.filter(node__name="node-a").exists()
    # Without a node name the credential's own node is meant: node-b's ranks, never node-a's.
    body = nodes["node-b"].post("/api/v1/agents/sync/", {"version": "1.0.0"}, format="json").json()
    assert body["node"] == "node-b"
    assert {r["node"] for w in body["work"] for r in w["ranks"]} == {"node-b"}
    assert {w["job"] for w in body["work"]} == {job.pk}


def test_a_report_about_another_nodes_rank_is_403_and_changes_nothing(nodes, alice, committed):
    job = submit(alice, committed, "j", 16)
    on_a = next(r["rank"] for r in job_ranks(job=job) if r["node"] == "node-a")
    forged = {"job": job.pk, "generation": 1, "rank": on_a, "event": "exited", "exit_code": 1}
    response = sync(nodes, "node-b", reports=[forged])
    assert response.status_code == 403 and f"rank {on_a}" in response.json()["detail"]
    assert not RankRun.objects.filter(job=job).exists()
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING
    # Once node-a's agent reported the rank, node-b still may not report it.
    committed(sync, nodes, "node-a", reports=[{**forged, "event": "started", "pid": 5}])
    assert sync(nodes, "node-b", reports=[forged]).status_code == 403
    assert RankRun.objects.get(job=job, rank=on_a).state == "started"


def test_a_revoked_node_token_is_refused(case44):
    node = Node.objects.get(cluster=case44, name="node-a")
    token, key = agents.node_token_create(node=node)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {key}")
    assert client.post("/api/v1/agents/sync/", {"version": "1"}, format="json").status_code == 200
    assert NodeToken.objects.get(pk=token.pk).last_used is not None
    assert key not in NodeToken.objects.values_list("key_hash", flat=True)
    agents.node_tokens_revoke(tokens=[token])
    node_tokens_forget()
    assert client.post("/api/v1/agents/sync/", {"version": "1"}, format="json").status_code == 401


def test_a_bad_report_is_refused_alone_and_the_rest_is_stored(nodes, alice, committed):
    job = submit(alice, committed, "j", 16)
    ranks = [r["rank"] for r in job_ranks(job=job) if r["node"] == "node-a"]
    raw = (
        '{"node": "node-a", "version": "1", "reports": ['
        f'{{"job": {job.pk}, "generation": 1, "rank": {ranks[0]}, "event": "started", "pid": 7,'
        r' "log_tail": "a\u0000b \ud800 c"},'
        f'{{"job": {job.pk}, "generation": 1, "rank": {ranks[1]}, "event": "exited"}},'
        f'{{"job": {job.pk}, "generation": 1, "rank": {ranks[2]}, "event": "started", "pid": 8}},'
        '"junk",'
        f'{{"job": 999999, "generation": 1, "rank": 0, "event": "started"}}'
        "]}"
    )
    response = committed(
        nodes["node-a"].generic, "POST", "/api/v1/agents/sync/", raw, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    refused = response.json()["refused"]
    assert [(r.get("rank"), r.get("job")) for r in refused] == [(ranks[1], job.pk), (None, None), (0, 999999)]
    assert "exit_code" in refused[0]["reason"] and "object" in refused[1]["reason"]
    assert "was ever placed" in refused[2]["reason"]
    stored = RankRun.objects.get(job=job, rank=ranks[0])
    assert stored.log_tail == "a\ufffdb \ufffd c" and stored.pid == 7
    assert RankRun.objects.filter(job=job, rank=ranks[2], state="started").exists()
    assert not RankRun.objects.filter(job=job, rank=ranks[1]).exists()
    assert NodeHealth.objects.get(node__name="node-a").state == NodeState.UP


def test_an_unhealthy_gpu_leaves_the_free_set_until_resumed(nodes, case44, staff_api):
    committed_sync = sync(nodes, unhealthy=[{"gpu": 3, "reason": "XID 79"}])
    assert committed_sync.status_code == 200
    snap = cluster_snapshot(cluster=case44)
    assert int(snap.free.sum()) == 15 and not snap.free[snap.topology.gid("node-a", 3)]
    node = Node.objects.get(cluster=case44, name="node-a")
    health = staff_api.get("/api/v1/node-health/", {"cluster": "case-4-4", "node": "node-a"}).json()
    assert health["results"][0]["unhealthy_gpus"] == [{"gpu": 3, "reason": "XID 79"}]
    assert staff_api.post(f"/api/v1/node-health/{node.pk}/resume/").status_code == 200
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 16


def test_a_gpu_missing_from_nvidia_smi_is_unhealthy(nodes, case44):
    gpus = [{"index": i, "uuid": f"GPU-{i}", "name": "A100"} for i in range(8) if i != 5]
    assert sync(nodes, gpus=gpus).status_code == 200
    assert NodeHealth.objects.get(node__name="node-a").unhealthy_gpus == [
        {"gpu": 5, "reason": "not found by nvidia-smi"}
    ]


def test_a_nodes_gpu_indexes_are_read_once_over_several_polls(nodes, case44, monkeypatch):
    """An agent's inventory is checked against the topology's GPU indexes every sync: they are
    remembered for longer than a 60 s poll, and read again after GPU_INDEXES_CACHE_S."""
    clock = [1000.0]
    monkeypatch.setattr(agent_selectors.time, "monotonic", lambda: clock[0])
    gpus = [{"index": i, "uuid": f"GPU-{i}", "name": "A100"} for i in range(8)]

    def gpu_reads() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert sync(nodes, gpus=gpus).status_code == 200
        return sum('FROM "topology_gpu"' in q["sql"] for q in queries.captured_queries)

    assert gpu_reads() == 1
    for _ in range(4):  # four polls a minute apart
        clock[0] += 61
        assert gpu_reads() == 0
    clock[0] += agent_selectors.GPU_INDEXES_CACHE_S
    assert gpu_reads() == 1


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


def test_a_job_that_never_starts_fails_once_its_max_requeues_are_used(case44, alice, committed, settings):
    settings.TOPOWEB_START_TIMEOUT_S = 60
    job = submit(alice, committed, "stuck", 16)
    limit = snap.job_spec(job).launch.max_requeues
    Job.objects.filter(pk=job.pk).update(requeues=limit, placed_at=timezone.now() - timedelta(seconds=61))
    changed = agents.nodes_check(cluster=case44)
    assert changed["requeued"] == [] and changed["failed_to_start"] == [job.pk]
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert f"not requeued: it was requeued {limit} times already, its max_requeues is {limit}" in (
        job.pending_reason
    )
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
    case44, nodes, alice, committed, settings
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "again", 8, requeue=True)
    node = job_ranks(job=job)[0]["node"]
    sync(nodes, node)
    NodeHealth.objects.filter(node__name=node).update(last_seen=timezone.now() - timedelta(seconds=31))
    server_answering()
    committed(agents.nodes_check, cluster=case44, now=fence_deadline_of(node))
    job.refresh_from_db()
    # Placed again on the other node by the cycle the release queued: nothing waits any more.
    assert job.status == JobStatus.PLACING and job.pending_reason == ""
    assert {r["node"] for r in job_ranks(job=job)} != {node}
    assert job.requeue_reason == f"node {node} went down and its fence deadline passed"


def live_gpus(job: Job) -> set[int]:
    return set(Allocation.objects.filter(job=job, live=True).values_list("gpu_id", flat=True))


def test_preempting_an_agent_run_job_waits_until_every_rank_exited(case44, nodes, alice, bob, committed):
    case44.preemption_enabled = True
    case44.save()
    low = submit(bob, committed, "low", 16)
    where = {r["rank"]: r["node"] for r in job_ranks(job=low)}
    for node in ("node-a", "node-b"):
        started = [
            {"job": low.pk, "generation": 1, "rank": r, "event": "started", "pid": 100 + r}
            for r in range(16)
            if where[r] == node
        ]
        committed(sync, nodes, node, reports=started)
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
        assert all(w["job"] != low.pk for w in sync(nodes, node).json()["work"])
    # Ranks exit one node at a time; each exit frees its GPU, never to anyone else meanwhile.
    for rank in range(15):
        exited = {"job": low.pk, "generation": 1, "rank": rank, "event": "exited", "exit_code": -15}
        committed(sync, nodes, where[rank], reports=[exited])
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


def test_a_preempted_job_is_placed_again_only_once_its_old_ranks_exited(case44, nodes, alice, bob, committed):
    case44.preemption_enabled = True
    case44.save()
    low = submit(bob, committed, "low", 8)
    old_node = job_ranks(job=low)[0]["node"]
    started = [
        {"job": low.pk, "generation": 1, "rank": r, "event": "started", "pid": 100 + r} for r in range(8)
    ]
    committed(sync, nodes, old_node, reports=started)
    high = submit(alice, committed, "high", 16, priority=5)
    low.refresh_from_db()
    assert low.status == JobStatus.PREEMPTED and high.status == JobStatus.QUEUED
    # The preemptor goes away before the victim's ranks exited: the victim is not placed again
    # while its old ranks still stop (two generations of one job never run at once).
    committed(services.job_cancel, job=high)
    low.refresh_from_db()
    assert low.status == JobStatus.PREEMPTED and low.generation == 1
    assert low.pending_reason == (
        f"waiting for its previous placement to stop: 8 GPUs on {old_node} still held by its ranks"
    )
    assert Allocation.objects.filter(job=low, live=True, generation=1).count() == 8
    exits = [
        {"job": low.pk, "generation": 1, "rank": r, "event": "exited", "exit_code": -15} for r in range(7)
    ]
    committed(sync, nodes, old_node, reports=exits)
    low.refresh_from_db()
    assert low.status == JobStatus.PREEMPTED
    assert "1 GPU on" in low.pending_reason
    last = {"job": low.pk, "generation": 1, "rank": 7, "event": "exited", "exit_code": -15}
    committed(sync, nodes, old_node, reports=[last])
    low.refresh_from_db()
    # Once the last old rank exited, its GPUs are free and the job is placed again.
    assert low.status == JobStatus.PLACING and low.generation == 2
    assert not Allocation.objects.filter(job=low, live=True, generation=1).exists()
    assert Allocation.objects.filter(job=low, live=True, generation=2).count() == 8


def test_a_silent_node_goes_down_and_its_job_runs_on_until_its_fence_deadline(
    case44, nodes, alice, committed, settings
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "j", 8)
    node = job_ranks(job=job)[0]["node"]
    started = [{"job": job.pk, "generation": 1, "rank": r, "event": "started"} for r in range(8)]
    committed(sync, nodes, node, reports=started)
    NodeHealth.objects.filter(node__name=node).update(last_seen=timezone.now() - timedelta(seconds=31))
    server_answering()
    assert committed(agents.nodes_check, cluster=case44)["down"] == [node]
    # Out of placement, but its job is untouched: the agent may be cut off, not dead.
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 8
    deadline = fence_deadline_of(node)
    before = committed(agents.nodes_check, cluster=case44, now=deadline - timedelta(seconds=1))
    assert before["fenced"] == [] and before["down"] == []
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    # At its fence deadline its agent surely stopped the ranks: they are lost, the job fails.
    assert committed(agents.nodes_check, cluster=case44, now=deadline)["fenced"] == [node]
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.pending_reason == f"node {node} went down and its fence deadline passed"
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 8
    assert committed(agents.nodes_check, cluster=case44, now=deadline)["fenced"] == []


def test_a_node_is_blamed_for_silence_only_while_the_server_answered_others(
    case44, nodes, alice, committed, settings
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "j", 8)
    node = job_ranks(job=job)[0]["node"]
    sync(nodes, node)
    NodeHealth.objects.filter(node__name=node).update(last_seen=timezone.now() - timedelta(seconds=300))
    now = timezone.now()
    # Nobody has been answered for 5 minutes (the web or the database was away): no node is down.
    SyncPulse.objects.filter(pk=1).update(
        answered_at=now - timedelta(seconds=299), back_at=now - timedelta(seconds=900)
    )
    assert committed(agents.nodes_check, cluster=case44)["down"] == []
    # The server answered again 20 s ago: silence counts from its return, 20 s < 30 s.
    SyncPulse.objects.filter(pk=1).update(answered_at=now, back_at=now - timedelta(seconds=20))
    assert committed(agents.nodes_check, cluster=case44)["down"] == []
    # 31 s of answering others without a word from the node: down; its job runs on.
    SyncPulse.objects.filter(pk=1).update(answered_at=now, back_at=now - timedelta(seconds=31))
    assert committed(agents.nodes_check, cluster=case44)["down"] == [node]
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING


def test_a_node_no_one_outlived_goes_down_at_its_fence_deadline(case44, nodes, alice, committed, settings):
    """A dead node whose silence the server cannot blame (no other node answered since) still
    loses its ranks at its fence deadline: its agent, if alive, has stopped them by then."""
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "j", 8, requeue=True)
    node = job_ranks(job=job)[0]["node"]
    started = [{"job": job.pk, "generation": 1, "rank": r, "event": "started"} for r in range(8)]
    committed(sync, nodes, node, reports=started)
    deadline = fence_deadline_of(node)
    assert committed(agents.nodes_check, cluster=case44, now=deadline - timedelta(seconds=1)) == {
        "down": [],
        "fenced": [],
        "drained": [],
        "requeued": [],
        "failed_to_start": [],
        "timed_out": [],
    }
    changed = committed(agents.nodes_check, cluster=case44, now=deadline)
    assert changed["down"] == [node] and changed["fenced"] == [node]
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING and node not in {r["node"] for r in job_ranks(job=job)}
    assert NodeHealth.objects.get(node__name=node).state == NodeState.DOWN


def test_the_sync_pulse_moves_at_most_every_few_seconds_and_marks_the_end_of_an_outage(db, settings):
    settings.TOPOWEB_AGENT_POLL_S = 60
    t0 = timezone.now()
    agents.sync_answered(now=t0)
    assert SyncPulse.objects.values_list("answered_at", "back_at").get() == (t0, t0)
    agents.sync_answered(now=t0 + timedelta(seconds=4))
    assert SyncPulse.objects.get().answered_at == t0
    t1 = t0 + timedelta(seconds=70)
    agents.sync_answered(now=t1)
    # A gap shorter than a poll and three pulses is no outage.
    assert SyncPulse.objects.values_list("answered_at", "back_at").get() == (t1, t0)
    t2 = t1 + timedelta(seconds=agents.away_after_s() + 1)
    agents.sync_answered(now=t2)
    assert SyncPulse.objects.values_list("answered_at", "back_at").get() == (t2, t2)


def test_a_node_back_before_its_fence_deadline_is_up_at_once_with_its_job_running(
    case44, nodes, alice, committed, settings
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "j", 8)
    node = job_ranks(job=job)[0]["node"]
    body = sync(nodes, node).json()
    assert body["fence_after_s"] == settings.TOPOWEB_AGENT_FENCE_AFTER_S
    assert body["fence_slack_s"] == agents.fence_slack_s() > 0
    keys = [[job.pk, 1, r] for r in range(8)]
    started = [{"job": job.pk, "generation": 1, "rank": r, "event": "started"} for r in range(8)]
    committed(sync, nodes, node, reports=started, running=keys)
    NodeHealth.objects.filter(node__name=node).update(last_seen=timezone.now() - timedelta(seconds=31))
    server_answering()
    assert committed(agents.nodes_check, cluster=case44)["down"] == [node]
    # Its ranks still run and the server still counts them: up at once, the job runs on.
    answer = committed(sync, nodes, node, running=keys).json()
    assert answer["state"] == "up" and answer["stop"] == []
    assert {r["rank"] for w in answer["work"] for r in w["ranks"]} == set(range(8))
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_a_node_back_after_its_ranks_were_counted_gone_takes_work_only_once_they_are(
    case44, nodes, alice, committed, settings
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30
    job = submit(alice, committed, "j", 8)
    node = job_ranks(job=job)[0]["node"]
    keys = [[job.pk, 1, r] for r in range(8)]
    started = [{"job": job.pk, "generation": 1, "rank": r, "event": "started"} for r in range(8)]
    committed(sync, nodes, node, reports=started, running=keys)
    NodeHealth.objects.filter(node__name=node).update(last_seen=timezone.now() - timedelta(seconds=31))
    server_answering()
    committed(agents.nodes_check, cluster=case44, now=fence_deadline_of(node))
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    # Its GPUs are released, but the node is down: only the other node's are free.
    assert not Allocation.objects.filter(job=job, live=True).exists()
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 8
    # Processes of ranks the server counts as gone still run (they may hold GPUs counted free):
    # the node stays down and gets no work.
    answer = sync(nodes, node, running=keys).json()
    assert answer["state"] == "down" and answer["work"] == [] and "still run" in answer["reason"]
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 8
    answer = sync(nodes, node, running=[]).json()
    assert answer["state"] == "up"
    assert int(cluster_snapshot(cluster=case44).free.sum()) == 16


def test_the_work_names_the_owners_unix_account_and_the_node_shows_isolation(nodes, alice, committed, client):
    from django.core.management import call_command

    submit(alice, committed, "j", 16)
    (work,) = sync(nodes, isolation="single-user (every rank runs as the agent's user); no cgroups").json()[
        "work"
    ]
    assert work["account"] == "alice"
    call_command("unix_account", "alice", "alice_hpc", stdout=io.StringIO())
    # A generation's work is cached as it was placed: the mapping applies from the next one.
    agent_selectors._CACHE.clear()
    (work,) = sync(nodes).json()["work"]
    assert work["account"] == "alice_hpc"
    client.force_login(alice)
    html = client.get("/clusters/case-4-4/nodes/node-a/").content.decode()
    assert "single-user mode" in html and "no cgroups" in html


def test_job_logs_show_each_ranks_output_tail(nodes, alice, alice_api, bob_api, committed):
    job = submit(alice, committed, "j", 2, estimated_runtime_s=60)
    reports = [
        {"job": job.pk, "generation": 1, "rank": 0, "event": "started", "pid": 10, "log_tail": "step 1\n"},
        {"job": job.pk, "generation": 1, "rank": 1, "event": "exited", "exit_code": 2, "log_tail": "oops\n"},
    ]
    committed(sync, nodes, job_ranks(job=job)[0]["node"], reports=reports)
    logs = alice_api.get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert [(r["rank"], r["log_tail"]) for r in logs] == [(0, "step 1\n"), (1, "oops\n")]
    assert bob_api.get(f"/api/v1/jobs/{job.pk}/logs/").status_code == 404
    assert alice_api.get(f"/api/v1/jobs/{job.pk}/logs/", {"rank": "x"}).status_code == 400
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "rank 1" in job.pending_reason and "oops" in job.pending_reason


def test_a_poll_waiting_in_an_event_loop_is_woken_by_its_node_or_cluster_from_another_thread():
    import asyncio
    import threading

    async def scenario():
        results = {}
        for what, nodes in (("node", ("node-w",)), ("cluster", None), ("other node", ("node-v",))):
            since = wakeups.epoch(424244, "node-w")
            waiting = asyncio.ensure_future(wakeups.changed(424244, "node-w", since, timeout_s=0.5))
            await asyncio.sleep(0)  # registered
            threading.Thread(target=wakeups._bump, args=(424244, nodes)).start()
            results[what] = await waiting
        # A change before the wait began ends it at once.
        results["before"] = await wakeups.changed(424244, "node-w", (-1, -1), timeout_s=60)
        return results

    assert asyncio.run(scenario()) == {"node": True, "cluster": True, "other node": False, "before": True}
    # Nothing is left registered once the polls ended.
    assert not [k for k in wakeups._WAITERS if k[0] == 424244]


def test_malformed_or_own_wakeups_change_nothing():
    before = wakeups.epoch(424243, "node-z")
    wakeups._apply(b"not json")
    wakeups._apply(json.dumps({"origin": wakeups._ORIGIN, "cluster": 424243, "nodes": ["node-z"]}))
    wakeups._apply(json.dumps({"origin": "x", "nodes": ["node-z"]}))
    assert wakeups.epoch(424243, "node-z") == before


def test_the_server_bounds_a_poll_by_its_own_interval(nodes, settings):
    settings.TOPOWEB_AGENT_POLL_S = 0.3
    sync(nodes)
    started = time.monotonic()
    body = sync(nodes, wait_s=30).json()
    # Nothing changed for the node: the poll waited, but the server's 0.3 s, not the asked 30 s.
    assert 0.25 <= time.monotonic() - started < 10
    assert body["work"] == [] and body["poll_s"] == 0.3 and body["down_after_s"] == agents.down_after_s()


@pytest.mark.django_db(transaction=True)
def test_a_sync_that_loses_the_write_lock_is_retried_not_refused(nodes, alice, monkeypatch):
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
    answer = sync(nodes, job_ranks(job=job)[0]["node"], reports=[report])
    assert answer.status_code == 200, answer.content
    assert calls == {"beat": 2, "report": 2}
    assert RankRun.objects.get(job=job, rank=0).pid == 100


def test_log_chunks_are_stored_once_and_paged_back(nodes, alice, alice_api, bob_api, committed, settings):
    job = submit(alice, committed, "j", 16)
    rank = next(r["rank"] for r in job_ranks(job=job) if r["node"] == "node-a")
    started = {"job": job.pk, "generation": 1, "rank": rank, "event": "started", "pid": 5}
    chunk = {"job": job.pk, "generation": 1, "rank": rank}
    body = sync(
        nodes,
        "node-a",
        reports=[started],
        logs=[
            {**chunk, "offset": 0, "size": 6, "data": "step1\n"},
            {**chunk, "offset": 6, "size": 7, "data": "st\x00p2\n"},
        ],
    ).json()
    assert body["logs"] == {f"{job.pk}:1:{rank}": 13} and body["refused_logs"] == []
    # An agent that restarted ships from 0 again: nothing is stored twice, it learns where to go on.
    again = sync(nodes, "node-a", logs=[{**chunk, "offset": 0, "size": 20, "data": "x" * 20}]).json()
    assert again["logs"] == {f"{job.pk}:1:{rank}": 13}
    url = f"/api/v1/jobs/{job.pk}/logs/{rank}/"
    page = alice_api.get(url, {"limit": 1}).json()
    assert (page["offset"], page["next_offset"], page["size"], page["more"]) == (0, 6, 13, True)
    assert page["text"] == "step1\n"
    page = alice_api.get(url, {"offset": page["next_offset"]}).json()
    assert page["text"] == "st\ufffdp2\n" and not page["more"]
    assert alice_api.get(url).json()["text"] == "step1\nst\ufffdp2\n"
    assert bob_api.get(url).status_code == 404
    assert alice_api.get(url, {"offset": -1}).status_code == 400
    # Over the server's limit: refused, and said why.
    settings.TOPOWEB_RANK_LOG_MAX_MB = 16 / (1024 * 1024)
    over = sync(nodes, "node-a", logs=[{**chunk, "offset": 13, "size": 4, "data": "more"}]).json()
    assert "limit" in over["refused_logs"][0]["reason"]
    # Another node's credential may not ship this rank's log.
    other = sync(nodes, "node-b", logs=[{**chunk, "offset": 13, "size": 1, "data": "x"}])
    assert other.status_code == 403


def test_a_bad_log_chunk_is_refused_alone(nodes, alice, committed):
    job = submit(alice, committed, "j", 16)
    rank = next(r["rank"] for r in job_ranks(job=job) if r["node"] == "node-a")
    body = sync(
        nodes,
        "node-a",
        reports=[{"job": job.pk, "generation": 1, "rank": rank, "event": "started"}],
        logs=[
            {"job": job.pk, "generation": 1, "rank": rank, "offset": 0, "size": 0, "data": ""},
            {"job": job.pk, "generation": 1, "rank": rank, "offset": 0, "size": 2, "data": "ok"},
        ],
    )
    assert body.status_code == 200
    answer = body.json()
    assert [r["index"] for r in answer["refused_logs"]] == [0] and "size" in answer["refused_logs"][0][
        "reason"
    ]
    assert answer["logs"] == {f"{job.pk}:1:{rank}": 2}


def test_the_rank_map_shows_the_master_addr_the_agents_give_the_ranks(nodes, alice, alice_api, committed):
    """Rank 0's node agent syncs with --addr 10.9.0.1: every node's work and every rank-map
    format name that address as MASTER_ADDR, not the node's name."""
    job = submit(alice, committed, "j", 16)
    addrs = {"node-a": "10.9.0.1", "node-b": "10.9.0.2"}
    for node, addr in addrs.items():
        sync(nodes, node, addr=addr)
    given = {w["master_addr"] for n, a in addrs.items() for w in sync(nodes, n, addr=a).json()["work"]}
    assert given == {"10.9.0.1"}
    url = f"/api/v1/jobs/{job.pk}/rankmap/"
    assert alice_api.get(url).json()["master_addr"] == "10.9.0.1"
    torchrun = alice_api.get(url, {"format": "torchrun"}).content.decode()
    assert torchrun.count("--master-addr=10.9.0.1") == 2 and "--master-addr=node-a" not in torchrun
    for fmt in ("openmpi", "slurm"):
        text = alice_api.get(url, {"format": fmt}).content.decode()
        assert "MASTER_ADDR=10.9.0.1" in text and "MASTER_ADDR=node-a" not in text, fmt


def test_a_remembered_node_token_is_rechecked_past_the_cache_time_and_a_change_elsewhere_refuses_it(
    case44, monkeypatch
):
    """Another web process revokes a token or renames its node (this one is not told): past
    KEY_CACHE_S the remembered token is re-checked by one small statement, accepted while nothing
    changed and refused, or looked up afresh, once something did."""
    from apps.api import authentication as auth

    node = Node.objects.get(cluster=case44, name="node-a")
    token, key = agents.node_token_create(node=node)
    node_tokens_forget()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {key}")

    def sync_at(offset: float, name: str = "node-a"):
        now = time.monotonic() + offset
        monkeypatch.setattr(auth, "time", types.SimpleNamespace(monotonic=lambda: now))
        return client.post("/api/v1/agents/sync/", {"version": "1", "node": name}, format="json")

    assert sync_at(0).status_code == 200
    lookups = []
    real_lookup = NodeAuthentication._lookup
    monkeypatch.setattr(
        NodeAuthentication, "_lookup", lambda self, ident: lookups.append(ident) or real_lookup(self, ident)
    )
    assert sync_at(auth.KEY_CACHE_S + 1).status_code == 200 and lookups == []
    Node.objects.filter(pk=node.pk).update(name="node-z")  # renamed elsewhere
    assert sync_at(2 * auth.KEY_CACHE_S + 2, "node-z").status_code == 200 and len(lookups) == 1
    NodeToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())  # revoked elsewhere
    assert sync_at(2 * auth.KEY_CACHE_S + 3, "node-z").status_code == 200  # still remembered
    assert sync_at(3 * auth.KEY_CACHE_S + 4, "node-z").status_code == 401


def test_remembered_node_tokens_due_are_rechecked_together_in_one_statement(case44, monkeypatch):
    """At a one-minute poll every remembered token is due at every sync: the first one found due
    re-checks all those due within half the cache time, so the others' syncs query no token."""
    from apps.api import authentication as auth

    clients = []
    for name in ("node-a", "node-b"):
        key = agents.node_token_create(node=Node.objects.get(cluster=case44, name=name))[1]
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Node {key}")
        clients.append((name, client))
    node_tokens_forget()

    def sync_at(offset: float, name: str, client):
        now = time.monotonic() + offset
        monkeypatch.setattr(auth, "time", types.SimpleNamespace(monotonic=lambda: now))
        with CaptureQueriesContext(connection) as queries:
            assert (
                client.post("/api/v1/agents/sync/", {"version": "1", "node": name}, format="json").status_code
                == 200
            )
        return [q["sql"] for q in queries.captured_queries if '"scheduling_nodetoken"' in q["sql"]]

    for name, client in clients:
        sync_at(0, name, client)
    (first, a), (second, b) = clients
    checks = sync_at(auth.KEY_CACHE_S + 1, first, a)
    assert len(checks) == 1 and " IN (" in checks[0], checks
    assert sync_at(auth.KEY_CACHE_S + 2, second, b) == []


def test_a_poll_with_work_reads_each_ranks_start_with_the_work(nodes, alice, committed):
    """The node's work, whether each of its ranks' starts was recorded and the rendezvous address
    come in one statement: a started rank is flagged, an exited one is left out."""
    job = submit(alice, committed, "j", 16)
    ranks = [r["rank"] for r in sync(nodes).json()["work"][0]["ranks"]]
    first, second, *rest = ranks
    reports = [{"job": job.pk, "generation": 1, "rank": r, "event": "started"} for r in (first, second)]
    committed(sync, nodes, reports=reports)
    exited = [{"job": job.pk, "generation": 1, "rank": second, "event": "exited", "exit_code": 0}]
    committed(sync, nodes, reports=exited)
    node = Node.objects.get(name="node-a")
    with CaptureQueriesContext(connection) as queries:
        work, stops = agent_selectors.node_work(node=node)
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
    (entry,) = work
    master = Allocation.objects.get(job=job, generation=1, rank=0).node_name
    assert entry["master_addr"] == rendezvous_addrs(cluster_id=node.cluster_id, nodes=[master])[master]
    started = {r["rank"]: r["started"] for r in entry["ranks"]}
    assert started == {first: True, **{r: False for r in rest}}
    assert stops == []


def test_the_agents_of_a_placed_job_read_its_generation_once(monkeypatch):
    """Polls asking at once for a generation not yet remembered wait for one read of it."""
    import threading

    reads = []

    def read(job_id, generation):
        reads.append((job_id, generation))
        time.sleep(0.2)
        return {"job": job_id, "generation": generation}

    monkeypatch.setattr(agent_selectors, "_read_generation", read)
    key = (987654, 3)
    answers = []
    threads = [
        threading.Thread(target=lambda: answers.append(agent_selectors._generation(*key))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert reads == [key]
    assert answers == [{"job": 987654, "generation": 3}] * 8
    assert not agent_selectors._LOADING


def test_rank_reports_are_validated_with_fields_bound_once_per_thread(monkeypatch):
    """Each report of a sync is validated on its own, by fields built once per thread: a bad report
    after good ones is refused naming its field, and the next good one is accepted."""
    from apps.executors.agents.api import serializers as sync_serializers

    monkeypatch.setattr(
        sync_serializers.RankReportSerializer, "_bound_fields", __import__("threading").local()
    )
    built = []
    get_fields = sync_serializers.RankReportSerializer.get_fields
    monkeypatch.setattr(
        sync_serializers.RankReportSerializer, "get_fields", lambda self: built.append(1) or get_fields(self)
    )
    good = {"job": 1, "generation": 1, "rank": 0, "event": "started", "pid": 7}
    items = [
        good,
        {**good, "rank": 1},
        {**good, "rank": -1},
        {**good, "event": "exited"},
        {**good, "rank": 2},
    ]
    reports, refused = sync_serializers.split_reports(items)
    assert len(built) == 1
    assert [(r.rank, r.pid) for r in reports] == [(0, 7), (1, 7), (2, 7)]
    assert [(r["index"], r["reason"].split(":")[0]) for r in refused] == [(2, "rank"), (3, "exit_code")]


def test_the_scope_of_a_nodes_reports_is_read_in_one_statement(nodes, alice, committed):
    """Own ranks (allocated or run on the node), another node's and ranks never placed: one query."""
    job = submit(alice, committed, "j", 16)
    ranks = job_ranks(job=job)
    mine = [r["rank"] for r in ranks if r["node"] == "node-a"]
    theirs = [r["rank"] for r in ranks if r["node"] != "node-a"]
    node = Node.objects.get(name="node-a")
    committed(sync, nodes, reports=[{"job": job.pk, "generation": 1, "rank": mine[0], "event": "started"}])
    reports = [
        agents.RankReport(job.pk, 1, mine[0], "started"),
        agents.RankReport(job.pk, 1, mine[1], "started"),
        agents.RankReport(job.pk, 1, theirs[0], "started"),
        agents.RankReport(job.pk, 2, mine[2], "started"),
        agents.RankReport(job.pk + 1, 1, mine[3], "started"),
    ]
    with CaptureQueriesContext(connection) as queries:
        foreign, unknown = agents.report_scope(node=node, reports=reports)
    assert len(queries.captured_queries) == 1
    assert foreign == {(job.pk, 1, theirs[0])}
    assert unknown == {(job.pk, 2, mine[2]), (job.pk + 1, 1, mine[3])}

"""The agents' sync served by uvicorn (topoweb.asgi, the `agents` service): a real uvicorn process
on the test database, its waiting polls woken through Redis by changes this process commits. Its
answers are those of the threaded view, and waiting polls hold none of its request threads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.executors.agents import services as agent_services
from apps.scheduling import services
from apps.scheduling.choices import JobStatus, RankState
from apps.scheduling.models import Allocation, NodeHealth, RankRun
from apps.topology.models import Node
from tests.ports import free_port
from topoweb.agents_asgi import SYNC_THREADS

from . import test_agents
from .agents import Agents, kill_groups
from .test_scheduling_postgres import wait_for

REPO = Path(__file__).resolve().parents[2]
# The agents tests' fixtures (case-4-4, a user, cycles run in this process) and job spec.
cluster, eager_cycles, user = test_agents.cluster, test_agents.eager_cycles, test_agents.user
spec = test_agents.spec
SYNC = "/api/v1/agents/sync/"
POLL_S = 30.0
INSTANCE = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def uvicorn_url(transactional_db, require_redis, settings, tmp_path) -> Iterator[str]:
    """uvicorn serving topoweb.asgi on the test database, wakeups through the test Redis."""
    settings.TOPOWEB_AGENT_POLL_S = POLL_S
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    env = dict(
        os.environ,
        DATABASE_URL=f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}",
        # Both processes publish and listen on this Redis (this one as CELERY_BROKER_URL).
        CACHE_URL=require_redis,
        TOPOWEB_TESTING="1",
        TOPOWEB_AGENT_POLL_S=str(POLL_S),
        TOPOWEB_LOG_LEVEL="WARNING",
    )
    port = free_port()
    log = tmp_path / "uvicorn.log"
    argv = [sys.executable, "-m", "uvicorn", "topoweb.asgi:application", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--lifespan", "off", "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, f"uvicorn exited: {log.read_text()[-3000:]}"
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, timeout_s=60, what="uvicorn to answer /healthz")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def node_key(cluster, name: str) -> str:
    return agent_services.node_token_create(node=Node.objects.get(cluster=cluster, name=name))[1]


def post(url: str, key: str, body, *, timeout: float = 10.0, headers=None) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = {"Authorization": f"Node {key}", "Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{url}{SYNC}", content=data, headers=head, timeout=timeout)


def in_process(key: str, body) -> tuple[int, dict]:
    """The same request answered by the view in this process (Django's test client, no wait)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Node {key}")
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = client.generic("POST", SYNC, data, content_type="application/json")
    return answer.status_code, json.loads(answer.content)


def test_uvicorn_answers_a_sync_and_its_errors_as_the_threaded_view_does(uvicorn_url, cluster):
    key = node_key(cluster, "node-a")
    other = node_key(cluster, "node-b")
    cases = [
        # A first sync: heartbeat, no work.
        {"node": "node-a", "version": "1.0", "instance": INSTANCE, "wait_s": 0},
        # A field out of bounds, another node's name, a report about a rank that never was.
        {"node": "node-a", "version": "1.0", "wait_s": -1},
        {"node": "node-b", "version": "1.0", "wait_s": 0},
        {"node": "node-a", "version": "1.0", "reports": [{"job": 999, "generation": 0, "rank": 0}]},
        b"{not json",
    ]
    for body in cases:
        served = post(uvicorn_url, key, body)
        status, answer = in_process(key, body)
        assert (served.status_code, served.json()) == (status, answer), body
    # Another agent instance on a live node's credential: 409 naming the holder, from both paths.
    second = {"node": "node-a", "version": "1.0", "instance": "f" * 32, "wait_s": 0}
    served = post(uvicorn_url, key, second)
    refusal = served.json()
    assert served.status_code == 409 and refusal["holder"]["instance"] == INSTANCE[:8]
    status, answer = in_process(key, second)
    assert status == 409
    # The same answer but for the seconds since the holder's sync, which moved in between.
    for holder in (answer["holder"], refusal["holder"]):
        holder.pop("silent_s")
    assert answer["holder"] == refusal["holder"]
    # The node credential only: an unknown key is refused; so is a body over the limit.
    served = post(uvicorn_url, "nope", cases[0])
    assert served.status_code in (401, 403) and (served.status_code, served.json()) == in_process(
        "nope", cases[0]
    )
    assert post(uvicorn_url, other, cases[0]).status_code == 403
    # Answered from the header, before any of the 8 MiB is sent (the client sends none of it).
    host, port = uvicorn_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        head = f"POST {SYNC} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Node {key}\r\n"
        raw.sendall(
            f"{head}Content-Type: application/json\r\nContent-Length: {8 * 1024 * 1024}\r\n\r\n".encode()
        )
        # The head and the body may come in separate segments: read until the body's figure is in.
        received = b""
        while b"limit_bytes" not in received and (segment := raw.recv(65536)):
            received += segment
        answer = received.decode()
    assert answer.startswith("HTTP/1.1 413 ") and '"limit_bytes":4194304' in answer.replace(" ", "")


def test_a_waiting_poll_is_answered_with_the_work_placed_on_its_node(uvicorn_url, cluster, user, tmp_path):
    keys = {n: node_key(cluster, n) for n in ("node-a", "node-b")}
    base = {"version": "1.0", "instance": INSTANCE, "running": [], "wait_s": POLL_S}
    for node in keys:
        assert post(uvicorn_url, keys[node], {**base, "node": node, "wait_s": 0}).status_code == 200
    # More waiting polls than the server has request threads: a wait holds none of them.
    answers: dict[str, httpx.Response] = {}

    def poll(name: str, node: str) -> None:
        answers[name] = post(uvicorn_url, keys[node], {**base, "node": node}, timeout=POLL_S + 30)

    waiting = [
        (f"{node}-{i}", node, threading.Thread(target=poll, args=(f"{node}-{i}", node)))
        for i in range(SYNC_THREADS + 2)
        for node in keys
    ]
    for _, _, thread in waiting:
        thread.start()
    # Answered at once (wait_s 0) while all of them wait.
    quick = post(uvicorn_url, keys["node-a"], {**base, "node": "node-a", "wait_s": 0})
    assert quick.status_code == 200 and quick.json()["work"] == []
    assert not answers
    # An 8-GPU job goes on one node: that node's polls return with its ranks, the other's wait on.
    job = services.job_submit(user=user, spec=spec(tmp_path, "woken", 8))
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING, job.pending_reason
    (node,) = set(Allocation.objects.filter(job=job, live=True).values_list("node_name", flat=True))
    woken = [(name, thread) for name, on, thread in waiting if on == node]
    for name, thread in woken:
        thread.join(timeout=POLL_S / 2)
        assert name in answers, f"poll {name} was not woken by the placement"
        work = answers[name].json()["work"]
        assert [(w["job"], len(w["ranks"])) for w in work] == [(job.pk, 8)]
    others = [(name, thread) for name, on, thread in waiting if on != node]
    assert not [name for name, _ in others if name in answers]
    for name, thread in others:
        thread.join(timeout=POLL_S + 30)
        assert answers[name].json()["work"] == []


def test_real_agents_run_a_job_through_uvicorn(uvicorn_url, cluster, user, tmp_path):
    agents = Agents(uvicorn_url, lambda node: node_key(cluster, node), tmp_path)
    try:
        for node in ("node-a", "node-b"):
            agents.start(node, poll_s=POLL_S)
        wait_for(
            lambda: NodeHealth.objects.filter(node__cluster=cluster).count() == 2,
            timeout_s=60,
            what="both agents to sync",
        )
        job = services.job_submit(user=user, spec=spec(tmp_path, "through-uvicorn", 16))

        def finished():
            job.refresh_from_db()
            return job.status in (JobStatus.COMPLETED, JobStatus.FAILED)

        # The agents wait in 30 s long-polls: only the wakeup through Redis starts the job sooner.
        wait_for(finished, timeout_s=POLL_S * 3, what="the job to finish")
        assert job.status == JobStatus.COMPLETED, job.pending_reason
        assert RankRun.objects.filter(job=job, state=RankState.EXITED).count() == 16
    finally:
        agents.close()
        kill_groups(RankRun.objects.filter(state=RankState.STARTED).values_list("pid", flat=True))

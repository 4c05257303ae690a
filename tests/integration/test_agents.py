"""Node agents on loopback against a live server: real agent processes launch a small program
that records its environment; the job lifecycle follows their reports."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from apps.executors.agents import services as agent_services
from apps.placement.topology import read_spec_file
from apps.scheduling import nodes, services
from apps.scheduling.choices import JobStatus, NodeState, RankState
from apps.scheduling.models import Allocation, Job, MigrationProposal, NodeHealth, RankRun
from apps.scheduling.selectors import job_ranks
from apps.topology import services as topology_services
from apps.topology.models import Node
from topoweb.celery import app as celery_app

from .agents import Agents, finish_live_requests, kill_groups, record_command, recorded
from .test_scheduling_postgres import wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def eager_cycles():
    """Cycles run in the process that requests them (here and in the live server's thread)."""
    before = celery_app.conf.task_always_eager
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    yield
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = before


@pytest.fixture
def cluster(transactional_db, request):
    name = getattr(request, "param", "case-4-4.yaml")
    return topology_services.cluster_import(data=read_spec_file(EXAMPLES / name))


@pytest.fixture
def user(transactional_db):
    return get_user_model().objects.create_user("alice", password="pw")


@pytest.fixture
def agents(live_server, cluster, tmp_path):
    def token_for(node: str) -> str:
        return agent_services.node_token_create(node=Node.objects.get(cluster=cluster, name=node))[1]

    running = Agents(live_server.url, token_for, tmp_path)
    yield running
    running.close()
    kill_groups(RankRun.objects.filter(state=RankState.STARTED).values_list("pid", flat=True))


@contextmanager
def double_booking_watch() -> Iterator[list[str]]:
    """While the block runs, a second thread (its own database connection) samples the live
    allocations every 50 ms; the yielded list collects each GPU found held by two jobs."""
    violations: list[str] = []
    stop = threading.Event()

    def watch():
        from django.db import connections

        try:
            while not stop.is_set():
                doubled = (
                    Allocation.objects.filter(live=True)
                    .values("gpu_id")
                    .annotate(jobs=Count("job_id", distinct=True))
                    .filter(jobs__gt=1)
                )
                if doubled.exists():
                    violations.append(f"GPU held by two jobs: {list(doubled)}")
                time.sleep(0.05)
        finally:
            connections.close_all()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield violations
    finally:
        stop.set()
        watcher.join()


def spec(tmp_path: Path, name: str, gpus: int, *, cluster="case-4-4", par=None, **env) -> dict:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return {
        "version": 1,
        "name": name,
        "cluster": cluster,
        "gpus": gpus,
        "parallelism": par or {"tp": 1, "pp": 1, "dp": gpus},
        "step": {"compute_ms": 100},
        "comm": [{"group": "dp", "collective": "allreduce", "bytes": 1e8}],
        "command": record_command(),
        "env": {"OUT_DIR": str(out), **env},
        "stop_grace_s": 2,
    }


def status_is(job: Job, *statuses: str):
    def check():
        job.refresh_from_db()
        return job.status in statuses

    return check


def assert_planned_environment(job: Job, out: Path) -> None:
    planned = {r["rank"]: r for r in job_ranks(job=job)}
    seen = recorded(out, job.generation)
    assert sorted(seen) == sorted(planned)
    for rank, env in seen.items():
        visible = env["CUDA_VISIBLE_DEVICES"].split(",")
        assert int(visible[int(env["LOCAL_RANK"])]) == planned[rank]["gpu"]
        assert env["RANK"] == str(rank)
        assert env["WORLD_SIZE"] == str(job.gpus)
        assert env["TOPOWEB_JOB_ID"] == str(job.pk)
        assert env["NCCL_IB_HCA"] == f"={planned[rank]['nic']}"
    # Local ranks number each node's ranks 0..k-1 in global rank order.
    by_node: dict[str, list[int]] = {}
    for rank in sorted(planned):
        by_node.setdefault(planned[rank]["node"], []).append(rank)
    for ranks in by_node.values():
        assert [int(seen[r]["LOCAL_RANK"]) for r in ranks] == list(range(len(ranks)))
        assert {seen[r]["LOCAL_WORLD_SIZE"] for r in ranks} == {str(len(ranks))}


@pytest.mark.parametrize("policy", ["topo", "naive"])
def test_every_rank_sees_its_planned_rank_and_gpu_on_case_4_4(agents, user, tmp_path, policy):
    for node in ("node-a", "node-b"):
        agents.start(node)
    job = services.job_submit(user=user, spec={**spec(tmp_path, f"bert-{policy}", 16), "policy": policy})
    wait_for(status_is(job, JobStatus.COMPLETED, JobStatus.FAILED), what="the job to finish")
    assert job.status == JobStatus.COMPLETED, job.pending_reason
    assert job.started_at is not None
    assert_planned_environment(job, tmp_path / "out")
    if policy == "naive":
        ranks = job_ranks(job=job)
        # The seed's interleaved mapping really is interleaved across the two nodes.
        assert len({r["node"] for r in ranks[:8]}) == 2
    assert not Allocation.objects.filter(job=job, live=True).exists()


@pytest.mark.parametrize("cluster", ["pod-256.yaml"], indirect=True)
def test_four_agents_on_pod_256_run_a_tp_pp_dp_job(agents, cluster, user, tmp_path):
    node = Node.objects.filter(cluster=cluster).order_by("position").first()
    # Hold the job until the agents of its nodes run: placed first, then agents started.
    body = spec(tmp_path, "llm-32", 32, cluster="pod-256", par={"tp": 8, "pp": 2, "dp": 2}, BEHAVIOUR="sleep")
    body["env"]["SLEEP_S"] = "1"
    job = services.job_submit(user=user, spec=body)
    job.refresh_from_db()
    assert job.status == JobStatus.PLACING
    nodes = sorted({r["node"] for r in job_ranks(job=job)})
    assert len(nodes) == 4 and node is not None
    for name in nodes:
        agents.start(name)
    wait_for(status_is(job, JobStatus.RUNNING, JobStatus.COMPLETED, JobStatus.FAILED), what="running")
    wait_for(status_is(job, JobStatus.COMPLETED, JobStatus.FAILED), what="the job to finish")
    assert job.status == JobStatus.COMPLETED, job.pending_reason
    assert_planned_environment(job, tmp_path / "out")


def test_a_failing_rank_fails_the_job_and_stops_the_others(agents, user, tmp_path):
    for node in ("node-a", "node-b"):
        agents.start(node)
    body = spec(tmp_path, "fails", 16, BEHAVIOUR="fail", FAIL_RANK="5", SLEEP_S="60")
    job = services.job_submit(user=user, spec=body)
    wait_for(status_is(job, JobStatus.FAILED, JobStatus.COMPLETED), what="the job to fail")
    assert job.status == JobStatus.FAILED
    assert "rank 5" in job.pending_reason and "code 3" in job.pending_reason
    assert "boom" in job.pending_reason
    wait_for(
        lambda: not RankRun.objects.filter(job=job, state=RankState.STARTED).exists(),
        what="the other ranks to stop",
    )
    assert RankRun.objects.filter(job=job, state=RankState.EXITED).count() == 16
    wait_for(lambda: not Allocation.objects.filter(job=job, live=True).exists(), what="GPUs released")


def test_cancel_stops_every_rank_and_frees_gpus_after_they_exit(agents, user, tmp_path):
    for node in ("node-a", "node-b"):
        agents.start(node)
    job = services.job_submit(user=user, spec=spec(tmp_path, "long", 16, BEHAVIOUR="sleep"))
    wait_for(status_is(job, JobStatus.RUNNING), what="running")
    services.job_cancel(job=job, user=user)
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    wait_for(
        lambda: RankRun.objects.filter(job=job, state=RankState.EXITED).count() == 16,
        what="every rank to exit",
    )
    codes = set(RankRun.objects.filter(job=job).values_list("exit_code", flat=True))
    assert codes <= {-15, 0}
    wait_for(lambda: not Allocation.objects.filter(job=job, live=True).exists(), what="GPUs released")


def test_killed_agents_make_their_nodes_down_and_their_jobs_fail_or_requeue_at_the_fence_deadline(
    agents, user, tmp_path, settings
):
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 4.0
    # A lease longer than the down time: the live agent, answered late on a loaded machine, keeps
    # its ranks while the victim goes down (a lease of 3 s fenced them at load 15).
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = 6.0
    # Every wait is derived from these: a node is down `down_s` after its last heartbeat, and
    # fenced `fence_s` after it (the agents' poll is 1 s); each wait allows several times that.
    down_s = agent_services.down_after_s()
    epoch = timezone.now()
    fence_s = (agent_services.fence_deadline(last_seen=epoch, grace_s=2.0) - epoch).total_seconds()
    for node in ("node-a", "node-b"):
        agents.start(node)
    plain = services.job_submit(user=user, spec=spec(tmp_path, "plain", 8, BEHAVIOUR="sleep"))
    # Its own output folder: both jobs' ranks are generation 1, ranks 0-7.
    (tmp_path / "out-again").mkdir()
    again = services.job_submit(
        user=user,
        spec={
            **spec(tmp_path, "again", 8, BEHAVIOUR="sleep", OUT_DIR=str(tmp_path / "out-again")),
            "requeue": True,
        },
    )
    wait_for(status_is(plain, JobStatus.RUNNING), what="plain running")
    wait_for(status_is(again, JobStatus.RUNNING), what="again running")
    victim = job_ranks(job=plain)[0]["node"]
    other = "node-b" if victim == "node-a" else "node-a"
    agents.kill(victim)
    killed_at = time.monotonic()
    cluster = plain.cluster
    # The other agent keeps syncing: the server answers, so the victim's silence is its own.
    wait_for(
        lambda: victim in agent_services.nodes_check(cluster=cluster)["down"] or None,
        timeout_s=5 * down_s + 10,
        what="the node to be marked down",
    )
    assert NodeHealth.objects.get(node__name=victim, node__cluster=cluster).state == NodeState.DOWN
    # Down takes the node out of placement; its job is left until its fence deadline (checked
    # only while that deadline is surely ahead: its last heartbeat written may be down_s / 2
    # before the kill, and a stalled test thread may have slept past it).
    plain.refresh_from_db()
    if time.monotonic() - killed_at < fence_s - down_s / 2 - 1:
        assert plain.status == JobStatus.RUNNING
    agents.kill(other)
    wait_for(
        lambda: agent_services.nodes_check(cluster=cluster)["fenced"] or plain.refresh_from_db(),
        timeout_s=3 * fence_s + 10,
        what="the first fence deadline",
    )
    plain.refresh_from_db()
    assert plain.status == JobStatus.FAILED
    assert plain.pending_reason == f"node {victim} went down and its fence deadline passed"

    # No other node answers now: the other node is not blamed for its silence, but its fence
    # deadline still passes, and the job that asked for it is requeued, not failed.
    def requeued():
        agent_services.nodes_check(cluster=cluster)
        again.refresh_from_db()
        return again.status != JobStatus.RUNNING

    wait_for(requeued, timeout_s=3 * fence_s + 10, what="the requeue at the deadline")
    assert again.status == JobStatus.QUEUED, again.pending_reason
    assert again.requeues == 1
    # Its node's fence deadline, or (had the server left the live agent unanswered for its whole
    # lease) that agent's own fence of its ranks: both are faults not the job's, both requeue it.
    assert again.requeue_reason == f"node {other} went down and its fence deadline passed" or (
        again.requeue_reason.startswith("rank ") and f"on node {other} was fenced" in again.requeue_reason
    ), again.requeue_reason
    assert not Allocation.objects.filter(job__in=[plain, again], live=True).exists()


def _lease(tmp_path: Path, node: str) -> dict:
    import json

    return json.loads((tmp_path / f"state-{node}" / "lease.json").read_text())


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_an_agent_restarted_after_more_than_its_lease_of_silence_asks_before_it_fences(
    agents, user, tmp_path, settings
):
    """SIGKILL an agent, restart it once its lease ran out: it re-adopts its ranks and reaches
    the server (which still counts them) before its bounded retry window ends, so nothing is
    fenced and the job runs on."""
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 30.0
    # The lease, and the slack as long: the restarted agent has lease_s - 1 s to start and reach
    # the server before it would fence (Python's start-up alone takes seconds at load 15).
    lease_s = 12.0
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = lease_s
    for node in ("node-a", "node-b"):
        agents.start(node)
    job = services.job_submit(user=user, spec=spec(tmp_path, "kept", 8, BEHAVIOUR="sleep"))
    wait_for(status_is(job, JobStatus.RUNNING), what="running")
    node = job_ranks(job=job)[0]["node"]
    pids = list(RankRun.objects.filter(job=job).values_list("pid", flat=True))
    assert len(pids) == 8 and all(_alive(p) for p in pids)
    agents.kill(node)
    lease = _lease(tmp_path, node)
    assert lease["fence_after_s"] == lease_s and lease["fence_slack_s"] == lease_s
    # More than the lease of silence (not more than the lease and its slack).
    while time.time() < lease["contact"] + lease_s + 1:
        time.sleep(0.1)
    agents.start(node)
    log = tmp_path / f"agent-{node}.out"
    wait_for(
        lambda: _lease(tmp_path, node)["contact"] > lease["contact"],
        timeout_s=lease_s - 1,
        what="a new contact",
    )
    # Past the longest a restarted agent could wait before it fences (contact + lease + slack).
    while time.time() < lease["contact"] + 2 * lease_s + 2:
        time.sleep(0.2)
    assert "fenced" not in log.read_text()
    assert all(_alive(p) for p in pids)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert RankRun.objects.filter(job=job, state=RankState.STARTED).count() == 8
    assert NodeHealth.objects.get(node__name=node, node__cluster=job.cluster).state == NodeState.UP


def test_a_control_plane_outage_longer_than_the_down_time_stops_no_rank(
    agents, user, tmp_path, settings, live_server
):
    """Every agent reaches the server through one TCP proxy; it is cut for longer than the down
    time (but shorter than the lease): no rank stops, no node is blamed, the jobs run on."""
    from urllib.parse import urlsplit

    from .agents import TcpProxy

    settings.TOPOWEB_AGENT_POLL_S = 1.0
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 4.0
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = 20.0
    where = urlsplit(live_server.url)
    proxy = TcpProxy((where.hostname, where.port))
    try:
        for node in ("node-a", "node-b"):
            agents.start(node, server=proxy.url)
        jobs = []
        for i in range(2):
            # Each job its own output folder: both jobs' ranks are generation 1, ranks 0-7.
            (tmp_path / f"out-{i}").mkdir()
            body = spec(tmp_path, f"j{i}", 8, BEHAVIOUR="sleep", OUT_DIR=str(tmp_path / f"out-{i}"))
            jobs.append(services.job_submit(user=user, spec=body))
        for job in jobs:
            wait_for(status_is(job, JobStatus.RUNNING), what="running")
        pids = list(RankRun.objects.filter(job__in=jobs).values_list("pid", flat=True))
        assert len(pids) == 16 and all(_alive(p) for p in pids)
        cluster = jobs[0].cluster
        proxy.cut()
        cut_at = time.monotonic()
        # The nodes' silence while nobody is answered is the server's, not theirs.
        while time.monotonic() - cut_at < 8.0:
            assert agent_services.nodes_check(cluster=cluster) == {
                "down": [],
                "fenced": [],
                "drained": [],
                "requeued": [],
                "failed_to_start": [],
                "timed_out": [],
            }
            time.sleep(0.5)
        proxy.heal()

        def both_synced():
            seen = NodeHealth.objects.filter(node__cluster=cluster).values_list("last_seen", flat=True)
            return all(s is not None and s.timestamp() > time.time() - 3 for s in seen)

        wait_for(both_synced, timeout_s=15, what="both agents to sync again")
        assert agent_services.nodes_check(cluster=cluster)["fenced"] == []
        assert all(_alive(p) for p in pids)
        for job in jobs:
            job.refresh_from_db()
            assert job.status == JobStatus.RUNNING
        assert RankRun.objects.filter(job__in=jobs, state=RankState.STARTED).count() == 16
        assert set(NodeHealth.objects.filter(node__cluster=cluster).values_list("state", flat=True)) == {
            NodeState.UP
        }
        for node in ("node-a", "node-b"):
            assert "fenced" not in (tmp_path / f"agent-{node}.out").read_text()
    finally:
        proxy.close()


def test_drain_then_resume_with_a_running_job(agents, user, tmp_path):
    for node in ("node-a", "node-b"):
        agents.start(node)
    body = spec(tmp_path, "short", 8, BEHAVIOUR="sleep", SLEEP_S="2")
    job = services.job_submit(user=user, spec=body)
    wait_for(status_is(job, JobStatus.RUNNING), what="running")
    node = Node.objects.get(cluster=job.cluster, name=job_ranks(job=job)[0]["node"])
    assert nodes.node_drain(node=node, reason="firmware").state == NodeState.DRAINING
    waiting = services.job_submit(user=user, spec=spec(tmp_path, "next", 16, BEHAVIOUR="exit"))
    wait_for(status_is(job, JobStatus.COMPLETED), what="the running job to finish")
    agent_services.nodes_check(cluster=job.cluster)
    assert NodeHealth.objects.get(node=node).state == NodeState.DRAINED
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.QUEUED
    nodes.node_resume(node=node)
    wait_for(status_is(waiting, JobStatus.COMPLETED), what="the 16-GPU job to run after resume")


def test_migration_holds_old_gpus_until_every_old_rank_exited(agents, user, tmp_path):
    """The old generation ignores SIGTERM for 2 s: meanwhile no GPU is booked for two jobs and
    the new generation starts only after the last old rank exited."""
    for node in ("node-a", "node-b"):
        agents.start(node)
    body = spec(tmp_path, "moving", 8, BEHAVIOUR="stubborn", STUBBORN_S="2")
    body["stop_grace_s"] = 10
    job = services.job_submit(user=user, spec=body)
    wait_for(status_is(job, JobStatus.RUNNING), what="running")
    old = job_ranks(job=job)
    old_node = old[0]["node"]
    new_node = "node-b" if old_node == "node-a" else "node-a"
    proposal = MigrationProposal.objects.create(
        job=job,
        old_mapping=[{"rank": r["rank"], "node": r["node"], "gpu": r["gpu"]} for r in old],
        new_mapping=[{"rank": r, "node": new_node, "gpu": 7 - r} for r in range(8)],
        predicted_gain=0.1,
        predicted_old_step_ms=110.0,
        predicted_new_step_ms=100.0,
    )
    with double_booking_watch() as violations:
        services.migration_apply(proposal=proposal, user=user)
        job.refresh_from_db()
        assert job.status == JobStatus.MIGRATING and job.generation == 2
        # A job that wants the old node must wait for the old ranks to exit.
        other = services.job_submit(user=user, spec=spec(tmp_path, "other", 8, BEHAVIOUR="exit"))
        other.refresh_from_db()
        assert other.status == JobStatus.QUEUED
        wait_for(status_is(job, JobStatus.RUNNING), timeout_s=30, what="the new generation to run")
        wait_for(status_is(other, JobStatus.COMPLETED), timeout_s=30, what="the other job to run")
    assert not violations
    old_exits = list(RankRun.objects.filter(job=job, generation=1).values_list("exited_at", flat=True))
    assert len(old_exits) == 8 and None not in old_exits
    last_old_exit = max(old_exits)
    new_starts = RankRun.objects.filter(job=job, generation=2).values_list("started_at", flat=True)
    assert len(new_starts) == 8 and min(new_starts) >= last_old_exit
    assert other.placed_at >= last_old_exit
    assert {r["node"] for r in job_ranks(job=job)} == {new_node}
    # The old ranks took their 2 s checkpoint: stopped by SIGTERM, not killed.
    assert set(RankRun.objects.filter(job=job, generation=1).values_list("exit_code", flat=True)) == {0}
    assert connection.vendor  # the test ran against the configured database


def test_preemption_of_an_agent_run_job_holds_its_gpus_until_every_rank_exited(
    agents, cluster, user, tmp_path
):
    """Two-phase preemption: the victim's ranks ignore SIGTERM for 2 s; meanwhile no GPU is
    booked for two jobs, and the preemptor is placed only on GPUs whose victim rank exited."""
    cluster.preemption_enabled = True
    cluster.save()
    for node in ("node-a", "node-b"):
        agents.start(node)
    body = spec(tmp_path, "low", 16, BEHAVIOUR="stubborn", STUBBORN_S="2")
    body["stop_grace_s"] = 10
    low = services.job_submit(user=user, spec=body)
    wait_for(status_is(low, JobStatus.RUNNING), what="the victim to run")
    with double_booking_watch() as violations:
        high = services.job_submit(
            user=user, spec={**spec(tmp_path, "high", 8, BEHAVIOUR="exit"), "priority": 5}
        )
        high.refresh_from_db()
        low.refresh_from_db()
        assert low.status == JobStatus.PREEMPTED and high.status == JobStatus.QUEUED
        held = {a.rank: (a.node_name, a.gpu_index) for a in Allocation.objects.filter(job=low, live=True)}
        assert len(held) == 16
        wait_for(status_is(high, JobStatus.COMPLETED), timeout_s=30, what="the preemptor to run")
    assert not violations
    on = {(a.node_name, a.gpu_index) for a in Allocation.objects.filter(job=high)}
    victims = RankRun.objects.filter(job=low, generation=1)
    assert victims.count() == 16 and None not in victims.values_list("exited_at", flat=True)
    freed = [r.exited_at for r in victims if held[r.rank] in on]
    assert len(freed) == 8 and high.placed_at >= max(freed)
    # The victim's ranks took their 2 s checkpoint: stopped by SIGTERM, not killed.
    assert set(victims.values_list("exit_code", flat=True)) == {0}
    low.refresh_from_db()
    assert low.requeue_reason == f"preempted by job {high.pk} (priority 5)"


def test_the_demo_agents_run_the_demo_job_to_completed(live_server, cluster, user, tmp_path):
    from apps.executors.agents.demo import start_demo_agents

    job = services.job_submit(user=user, spec=spec(tmp_path, "demo-like", 16, BEHAVIOUR="sleep", SLEEP_S="1"))
    started = start_demo_agents(server=live_server.url, poll_s=1.0, log_dir=str(tmp_path / "agent-logs"))
    try:
        assert sorted(a.node for a in started) == ["node-a", "node-b"]
        wait_for(status_is(job, JobStatus.RUNNING, JobStatus.COMPLETED), what="running")
        wait_for(status_is(job, JobStatus.COMPLETED, JobStatus.FAILED), what="completed")
        assert job.status == JobStatus.COMPLETED, job.pending_reason
    finally:
        for agent in started:
            agent.stop()
        for agent in started:
            agent.thread.join(timeout=15)
        finish_live_requests()  # first: the flush must not meet a sync, whatever is asserted next
        assert not any(agent.thread.is_alive() for agent in started)


def test_nul_and_invalid_utf8_output_keeps_the_node_up_and_every_log_whole(agents, user, tmp_path):
    """A rank writing NUL and invalid UTF-8 neither poisons its node's syncs nor loses output: the
    job completes, the next job runs, the node stays up, and the whole log reads back."""
    from apps.scheduling.models import RankLogChunk

    for node in ("node-a", "node-b"):
        agents.start(node)
    program = (
        "import os, sys; out = sys.stdout.buffer; out.write(b'start\\n');"
        " out.write(b'bad \\x00 nul \\xff\\xfe utf8\\n' * 2000); out.write(b'end\\n'); out.flush()"
    )
    first = services.job_submit(
        user=user, spec={**spec(tmp_path, "binary", 16), "command": [sys.executable, "-c", program]}
    )
    wait_for(status_is(first, JobStatus.COMPLETED, JobStatus.FAILED), what="the binary job to finish")
    assert first.status == JobStatus.COMPLETED, first.pending_reason
    run = RankRun.objects.get(job=first, rank=0)
    assert "\ufffd" in run.log_tail and "end" in run.log_tail
    expected = b"start\n" + b"bad \x00 nul \xff\xfe utf8\n" * 2000 + b"end\n"
    wait_for(
        lambda: sum(RankLogChunk.objects.filter(run=run).values_list("size", flat=True)) == len(expected),
        what="the whole log shipped",
    )
    text = "".join(RankLogChunk.objects.filter(run=run).order_by("offset").values_list("text", flat=True))
    assert text == expected.decode("utf-8", "replace").replace("\x00", "\ufffd")
    assert set(NodeHealth.objects.values_list("state", flat=True)) == {NodeState.UP}
    second = services.job_submit(user=user, spec=spec(tmp_path, "after", 16))
    wait_for(status_is(second, JobStatus.COMPLETED, JobStatus.FAILED), what="the next job to finish")
    assert second.status == JobStatus.COMPLETED, second.pending_reason


def test_an_agent_ships_its_sysfs_nic_counters_and_the_server_turns_them_into_rates(agents, tmp_path):
    from apps.metrics.models import NicLatest

    counters = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    counters.mkdir(parents=True)
    (counters / "port_xmit_data").write_text("1000\n")  # 4-byte words
    (counters / "port_rcv_data").write_text("500\n")
    agents.start("node-a", extra=["--sysfs-root", str(tmp_path / "sys")])

    def row():
        return NicLatest.objects.filter(node__name="node-a", device="mlx5_0", port="1").first()

    wait_for(lambda: row() is not None, what="the first counters")
    assert (row().tx_bytes_total, row().rx_bytes_total) == (4000, 2000)
    (counters / "port_xmit_data").write_text("26000\n")  # 100,000 bytes more
    wait_for(lambda: row().tx_bytes_total == 104_000 and row().tx_Bps, what="a rate from two syncs")
    assert row().tx_Bps > 0 and row().rx_Bps == 0

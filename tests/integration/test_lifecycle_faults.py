"""The job lifecycle under the faults nobody planned for, on real agent and rank processes
(Postgres, the live server): a node whose agent lost its ranks and its state, retention while a
job runs, a requeue while the old generation is still stopping behind a frozen agent. Each ends
with 0 GPUs booked without a live rank and 0 moments where one job's two generations ran."""

from __future__ import annotations

import os
import shutil
import signal
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.executors.agents import services as agent_services
from apps.scheduling import services
from apps.scheduling.choices import JobStatus, NodeState, RankState
from apps.scheduling.models import Allocation, NodeHealth, RankRun
from apps.scheduling.retention import scheduling_retain
from apps.scheduling.selectors import job_ranks

from .agents import gpu_use_watch, kill_cgroups, kill_groups
from .test_agents import agents, cluster, eager_cycles, spec, status_is, user  # noqa: F401
from .test_scheduling_postgres import wait_for

pytestmark = pytest.mark.integration


def reconcile_clean() -> None:
    out = StringIO()
    try:
        call_command("reconcile", "--check", stdout=out)
    except SystemExit as exc:
        pytest.fail(f"reconcile --check exited {exc.code}:\n{out.getvalue()}")
    assert out.getvalue().endswith("0 findings\n")


def test_a_restarted_agent_that_lost_its_ranks_and_state_frees_a_failed_jobs_gpus(
    agents,  # noqa: F811
    user,  # noqa: F811
    tmp_path,
):
    """A 2-node job; node-b's agent dies with its ranks and its state directory; a rank on node-a
    then fails. Restarted, node-b's agent has no trace of its ranks: the server lists them to stop,
    the agent reports them gone, and every GPU of the job is free within a few syncs."""
    for node in ("node-a", "node-b"):
        agents.start(node, poll_s=1.0)
    job = services.job_submit(
        user=user, spec=spec(tmp_path, "two-nodes", 16, BEHAVIOUR="sleep", SLEEP_S="120")
    )
    wait_for(status_is(job, JobStatus.RUNNING), what="running")
    on_b = [r for r in job_ranks(job=job) if r["node"] == "node-b"]
    assert len(on_b) == 8
    # node-b goes away whole: its agent, every rank process, and its state directory.
    agents.kill("node-b")
    kill_cgroups([d / "node-b" for d in agents.cgroup_dirs()])
    kill_groups(RankRun.objects.filter(job=job, node__name="node-b").values_list("pid", flat=True))
    shutil.rmtree(tmp_path / "state-node-b")
    # A rank on node-a dies: the job fails, node-a's agent stops its other ranks.
    victim = RankRun.objects.filter(job=job, node__name="node-a").order_by("rank").first()
    os.killpg(victim.pid, signal.SIGKILL)
    wait_for(status_is(job, JobStatus.FAILED), what="the job to fail")
    wait_for(
        lambda: not Allocation.objects.filter(job=job, live=True, node_name="node-a").exists(),
        what="node-a's GPUs freed as its agent stopped the ranks",
    )
    # node-b's ranks are still counted running: their GPUs stay booked while nobody says otherwise.
    time.sleep(2.0)
    assert Allocation.objects.filter(job=job, live=True, node_name="node-b").count() == 8
    agents.start("node-b", poll_s=1.0)
    wait_for(
        lambda: not Allocation.objects.filter(job=job, live=True).exists(),
        timeout_s=15,
        what="node-b's GPUs freed once its restarted agent reported the ranks gone",
    )
    lost = RankRun.objects.filter(job=job, node__name="node-b")
    assert {r.state for r in lost} == {RankState.EXITED}
    assert all("no record" in r.log_tail for r in lost)
    # A job needing both whole nodes now runs.
    both = services.job_submit(user=user, spec=spec(tmp_path, "both-nodes", 16, BEHAVIOUR="exit"))
    wait_for(status_is(both, JobStatus.COMPLETED), timeout_s=30, what="the 16-GPU job to run")
    reconcile_clean()


def test_retention_while_a_job_with_an_early_exited_rank_runs_lets_it_complete(
    agents,  # noqa: F811
    user,  # noqa: F811
    tmp_path,
    settings,
):
    settings.RETAIN_RANK_RECORDS_DAYS = 1
    agents.start("node-a")
    agents.start("node-b")
    job = services.job_submit(user=user, spec=spec(tmp_path, "early", 8, BEHAVIOUR="early", SLEEP_S="4"))
    wait_for(
        lambda: RankRun.objects.filter(job=job, rank=0, state=RankState.EXITED, exit_code=0).exists(),
        what="rank 0 to be done early",
    )
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    # Its record is old enough for retention; the job still needs it to complete.
    RankRun.objects.filter(job=job, rank=0).update(exited_at=timezone.now() - timedelta(days=2))
    scheduling_retain()
    assert RankRun.objects.filter(job=job, rank=0).exists()
    wait_for(status_is(job, JobStatus.COMPLETED), timeout_s=30, what="the job to complete")
    assert not Allocation.objects.filter(job=job, live=True).exists()
    reconcile_clean()


def test_a_job_behind_a_frozen_agent_is_left_running_until_its_agent_fences_it(
    agents,  # noqa: F811
    user,  # noqa: F811
    tmp_path,
    settings,
    monkeypatch,
):
    """node-a's agent is frozen (SIGSTOP) under a `requeue: true` job whose ranks ignore SIGTERM:
    the node is declared down (node-b's agent shows the server answering), but the job is neither
    requeued nor placed again while its ranks may live. Thawed, the agent finds its lease expired
    and fences them (SIGTERM ignored, SIGKILL after the grace) and reports the exits, which end
    the job back to the queue (fenced is not the job's own failure). A /proc watcher checks every 0.1 s that no job ever has live processes of two
    generations."""
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 3.0
    # The lease: longer than a loaded machine's slowest answer (a 2 s one ran out before the
    # first answer arrived at load 12, and the agent fenced the job before it was frozen); the
    # agent stays frozen longer than it, so that it fences when thawed.
    lease_s = 10.0
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = lease_s
    # The server's fence deadline (last_seen + 29.5 s with the figures above) can come before the
    # checks below end on a loaded machine, and then the server, not the thawed agent, ends the
    # ranks. A wider margin (server side only: the agent's lease is unchanged) leaves the agent
    # to fence first, however slow the machine.
    monkeypatch.setattr(agent_services, "FENCE_MARGIN_S", 90.0)
    for node in ("node-a", "node-b"):
        agents.start(node, poll_s=1.0)
    body = {**spec(tmp_path, "deaf", 8, BEHAVIOUR="deaf", SLEEP_S="300"), "requeue": True, "stop_grace_s": 3}
    marker = tmp_path / "out"
    with gpu_use_watch(marker, period_s=0.1) as seen:
        job = services.job_submit(user=user, spec=body)
        wait_for(status_is(job, JobStatus.RUNNING), what="running")
        node = job_ranks(job=job)[0]["node"]
        other = "node-b" if node == "node-a" else "node-a"
        agents.procs[node].send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            cluster = job.cluster
            wait_for(
                lambda: node in agent_services.nodes_check(cluster=cluster)["down"] or None,
                timeout_s=20,
                what="the frozen node to be declared down",
            )
            # Its ranks may still run (the frozen agent never fenced them): the job runs on.
            for _ in range(10):
                agent_services.nodes_check(cluster=cluster)
                job.refresh_from_db()
                assert job.status == JobStatus.RUNNING and job.generation == 1
                time.sleep(0.2)
            time.sleep(max(0.0, frozen_at + lease_s + 1.0 - time.monotonic()))
        finally:
            agents.procs[node].send_signal(signal.SIGCONT)
        # Thawed: the agent fences its ranks (grace 3 s, then SIGKILL) and reports their exits.

        def ended():
            agent_services.nodes_check(cluster=job.cluster)
            job.refresh_from_db()
            left = RankRun.objects.filter(job=job, generation=1, state=RankState.STARTED).exists()
            return (
                job.generation > 1 or job.status not in (JobStatus.PLACING, JobStatus.RUNNING)
            ) and not left

        wait_for(ended, timeout_s=40, what="the fenced ranks' exits to requeue the job")
    # The watcher sampled throughout (each sample reads every process of the machine: slower under load).
    assert seen.samples >= 10
    assert seen.generation_violations == []
    assert seen.violations == []
    old = RankRun.objects.filter(job=job, generation=1)
    assert {r.state for r in old} == {RankState.EXITED}
    # Killed by the agent after its grace (-9), not counted gone by the server's deadline.
    assert {r.exit_code for r in old} == {-9}
    assert all("fenced" in r.log_tail for r in old)
    # Fenced is not the job's own failure: the `requeue: true` job went back to the queue.
    assert {r.exit_cause for r in old} == {"fenced"}
    job.refresh_from_db()
    assert job.status != JobStatus.FAILED, job.pending_reason
    assert job.requeues == 1
    assert {r["node"] for r in job_ranks(job=job)} <= {node, other}
    wait_for(
        lambda: NodeHealth.objects.get(node__name=node, node__cluster=job.cluster).state == NodeState.UP,
        what="the node back up once its old ranks are gone",
    )
    if job.status in (JobStatus.QUEUED, JobStatus.PLACING, JobStatus.RUNNING):
        services.job_cancel(job=job)
    wait_for(lambda: not Allocation.objects.filter(job=job, live=True).exists(), what="GPUs freed")
    reconcile_clean()

"""Honest exits on real agent processes: a killed shim leaves its rank running, a rank past its
job's pids_max ends with cause pids_limit, and a fenced rank requeues a `requeue: true` job
instead of failing it. Root with cgroups (as CI)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from apps.scheduling import services
from apps.scheduling.choices import ExitCause, JobStatus, RankState
from apps.scheduling.models import RankRun
from apps.scheduling.selectors import job_ranks

from . import test_agent_isolation as isolation
from .agents import FENCED, TcpProxy, cgroups_writable
from .test_agents import agents, cluster, eager_cycles, spec, status_is, user  # noqa: F401
from .test_scheduling_postgres import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        isolation.not_in_ci(not cgroups_writable()), reason="needs root and a writable cgroup hierarchy"
    ),
]


def _rank_pid(out, generation: int, rank: int) -> int:
    """The pid the rank recorded (its own, not its shim's)."""
    return int(json.loads((out / f"{generation}-{rank}.json").read_text())["pid"])


def test_a_killed_shim_leaves_its_rank_running_and_its_job_running(agents, cluster, user, tmp_path):
    """SIGKILL to a rank's shim: the rank runs on and its job stays running; when the rank ends
    at last, its exit (status unknowable) is reported lost and the requeue job goes back to the
    queue saying so."""
    isolation._drain_other(cluster, "node-a")
    agents.start("node-a")
    body = {**spec(tmp_path, "shim", 2, BEHAVIOUR="sleep", SLEEP_S="120"), "requeue": True}
    job = services.job_submit(user=user, spec=body)
    wait_for(status_is(job, JobStatus.RUNNING), what="running")
    out = tmp_path / "out"
    wait_for(lambda: (out / "1-1.json").exists(), what="rank 1 to record itself")
    rank = _rank_pid(out, 1, 1)
    shim = RankRun.objects.get(job=job, generation=1, rank=1).pid
    assert shim and shim != rank and isolation._alive(shim)
    os.kill(shim, signal.SIGKILL)
    wait_for(lambda: not isolation._alive(shim), what="the shim to die")
    # Several polls later: the rank still runs and so does its job.
    time.sleep(4)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING, job.pending_reason
    assert isolation._alive(rank), "the agent stopped a healthy rank whose shim was killed"
    assert RankRun.objects.get(job=job, generation=1, rank=1).state == RankState.STARTED
    assert "its shim is gone" in (tmp_path / "agent-node-a.out").read_text()
    os.kill(rank, signal.SIGKILL)
    wait_for(
        status_is(job, JobStatus.QUEUED, JobStatus.PLACING, JobStatus.RUNNING, JobStatus.FAILED), what="x"
    )
    wait_for(
        lambda: RankRun.objects.filter(job=job, generation=1, rank=1, state=RankState.EXITED).exists(),
        what="the rank's exit",
    )
    run = RankRun.objects.get(job=job, generation=1, rank=1)
    assert run.exit_cause == ExitCause.LOST and run.exit_code == 255
    job.refresh_from_db()
    assert job.requeues == 1 and job.status != JobStatus.FAILED
    assert job.requeue_reason == "rank 1 on node node-a was lost: its shim was killed; exit status unknown"


FORKER = (
    "import os, sys, time\n"
    "for _ in range(500):\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(5)\n"
    "            os._exit(0)\n"
    "    except OSError as exc:\n"
    "        print('fork refused:', exc, flush=True)\n"
    "        sys.exit(1)\n"
)


def test_a_rank_past_its_jobs_pids_max_ends_with_pids_limit(agents, cluster, user, tmp_path):
    isolation._drain_other(cluster, "node-a")
    agents.start("node-a")
    body = {**spec(tmp_path, "forks", 2), "command": [sys.executable, "-c", FORKER], "pids_max": 64}
    job = services.job_submit(user=user, spec=body)
    wait_for(status_is(job, JobStatus.FAILED, JobStatus.COMPLETED), what="the job to end")
    assert job.status == JobStatus.FAILED
    assert "ran into its limit of processes and threads (pids_max)" in job.pending_reason, job.pending_reason
    assert "fork refused" in job.pending_reason
    causes = set(RankRun.objects.filter(job=job, state=RankState.EXITED).values_list("exit_cause", flat=True))
    assert ExitCause.PIDS_LIMIT in causes


def test_a_fenced_rank_requeues_a_requeue_job_instead_of_failing_it(
    agents, cluster, user, tmp_path, settings, live_server
):
    """The agent's connection is cut for longer than its lease (but not so long that the server
    marks the node down): it fences its ranks; healed, it reports them fenced and the job goes
    back to the queue, counted, and runs again."""
    from urllib.parse import urlsplit

    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 120.0
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = isolation.LONG_LEASE_S
    isolation._drain_other(cluster, "node-a")
    where = urlsplit(live_server.url)
    proxy = TcpProxy((where.hostname, where.port))
    agents.start("node-a", server=proxy.url)
    log = tmp_path / "agent-node-a.out"
    try:
        body = {**spec(tmp_path, "fenced", 2, BEHAVIOUR="sleep", SLEEP_S="120"), "requeue": True}
        job = services.job_submit(user=user, spec=body)
        wait_for(status_is(job, JobStatus.RUNNING), what="running")
        isolation.shorten_lease(agents, settings, "node-a")
        proxy.cut()
        wait_for(lambda: FENCED in log.read_text(), timeout_s=15, what="the agent to fence its ranks")
        # The job runs again on a lease no busy machine's slow sync outlasts (a 2 s one fenced the
        # new generation too at load 11 on a slow machine); the agent takes it from its next answer.
        settings.TOPOWEB_AGENT_FENCE_AFTER_S = isolation.LONG_LEASE_S
        proxy.heal()
        # Each step waits on a sync, a cycle or a rank's start: generous at load 15.
        wait_for(lambda: job_requeued(job), timeout_s=60, what="the job to be requeued")
        job.refresh_from_db()
        assert job.status != JobStatus.FAILED, job.pending_reason
        assert job.requeues == 1
        assert "was fenced: the node agent had no contact with the server" in job.requeue_reason
        # The first fenced rank's report requeues the job; the other's may come a sync later.
        wait_for(
            lambda: not RankRun.objects.filter(job=job, generation=1)
            .exclude(state=RankState.EXITED)
            .exists(),
            timeout_s=60,
            what="both fenced ranks' exits reported",
            explain=agents.explain,
        )
        assert set(RankRun.objects.filter(job=job, generation=1).values_list("exit_cause", flat=True)) == {
            ExitCause.FENCED
        }
        # Placed again once its fenced ranks are gone, and running.
        wait_for(lambda: job_running_again(job), timeout_s=60, what="the job to run again")
    finally:
        proxy.close()


def job_requeued(job) -> bool:
    job.refresh_from_db()
    return job.requeues > 0 or job.status == JobStatus.FAILED


def job_running_again(job) -> bool:
    job.refresh_from_db()
    return job.generation == 2 and job.status == JobStatus.RUNNING and bool(job_ranks(job=job))

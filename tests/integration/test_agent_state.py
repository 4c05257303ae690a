"""The node agent under faults of its state and of its credential, on real processes: a lost or
corrupt state directory (its ranks become orphans, stopped through their cgroups while the node
takes no new work), a state directory of another server, two agents on one node credential or
one state directory, and an agent killed before it recorded a rank's shim."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from apps.scheduling import services
from apps.scheduling.choices import JobStatus, RankState
from apps.scheduling.models import NodeHealth, RankRun
from apps.scheduling.selectors import job_ranks

from .agents import REPO, _live_rank_envs, cgroups_writable, gpu_use_watch, recorded
from .test_agents import agents, cluster, eager_cycles, spec, status_is, user  # noqa: F401
from .test_scheduling_postgres import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not cgroups_writable(), reason="needs root with a writable cgroup hierarchy"),
]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def _running_job(agents, user, tmp_path, name: str, **env) -> tuple:  # noqa: F811
    """Both agents up and an 8-GPU job of `name` running; (job, its node, its ranks' pids)."""
    for node in ("node-a", "node-b"):
        agents.start(node)
    job = services.job_submit(user=user, spec=spec(tmp_path, name, 8, **env))
    wait_for(status_is(job, JobStatus.RUNNING), what=f"{name} running")
    node = job_ranks(job=job)[0]["node"]
    wait_for(lambda: len(recorded(tmp_path / "out", job.generation)) == 8, what="every rank recorded")
    pids = {r: env["pid"] for r, env in recorded(tmp_path / "out", job.generation).items()}
    assert all(_alive(p) for p in pids.values())
    return job, node, pids


def _orphans_seen(node: str) -> list:
    return NodeHealth.objects.get(node__name=node).orphans


@pytest.mark.parametrize("fault", ["deleted", "corrupted"])
def test_a_lost_state_directory_stops_the_orphans_and_places_nothing_beside_them(
    agents,  # noqa: F811
    user,  # noqa: F811
    tmp_path,
    fault,
):
    """The agent is killed, its state directory deleted or its records corrupted, and restarted:
    the ranks it has no record of still run in their cgroups; it stops them (they hold SIGTERM 3 s),
    reports them as orphans meanwhile, and the waiting 16-GPU job starts on their GPUs only once
    they are gone (checked from /proc)."""
    with gpu_use_watch(tmp_path) as use:
        job, node, pids = _running_job(agents, user, tmp_path, "first", BEHAVIOUR="stubborn", STUBBORN_S="3")
        waiting = services.job_submit(user=user, spec=spec(tmp_path, "next", 16, BEHAVIOUR="exit"))
        agents.kill(node)
        state = tmp_path / f"state-{node}"
        if fault == "deleted":
            shutil.rmtree(state)
        else:
            for record in state.glob("job-*/rank.json"):
                record.write_text('{"key": [1, 1')
        assert all(_alive(p) for p in pids.values())
        agents.start(node)
        seen = wait_for(lambda: _orphans_seen(node), timeout_s=20, what="the orphans reported")
        assert {o["rank"] for o in seen} <= set(pids) and all(o["pids"] for o in seen)
        waiting.refresh_from_db()
        assert waiting.status == JobStatus.QUEUED
        wait_for(lambda: not any(_alive(p) for p in pids.values()), timeout_s=20, what="orphans stopped")
        wait_for(status_is(job, JobStatus.FAILED), what="the job of the orphans to end")
        wait_for(status_is(waiting, JobStatus.COMPLETED), timeout_s=30, what="the next job to run")
    assert use.samples > 10 and not use.violations, use.violations
    assert not _orphans_seen(node)
    assert "orphan job-" in (tmp_path / f"agent-{node}.out").read_text()


def test_a_state_directory_of_another_server_is_not_adopted(agents, user, tmp_path):  # noqa: F811
    """The state directory names another server: its records' ranks are stopped as that server's
    orphans and never reported as this server's (no re-adoption report)."""
    job, node, pids = _running_job(agents, user, tmp_path, "theirs", BEHAVIOUR="stubborn", STUBBORN_S="2")
    agents.kill(node)
    identity = tmp_path / f"state-{node}" / "identity.json"
    mine = json.loads(identity.read_text())
    identity.write_text(json.dumps({**mine, "server": "0ther5e7"}))
    agents.start(node)
    seen = wait_for(lambda: _orphans_seen(node), timeout_s=20, what="the orphans reported")
    assert {o["server"] for o in seen} == {"0ther5e7"}
    wait_for(lambda: not any(_alive(p) for p in pids.values()), timeout_s=20, what="orphans stopped")
    wait_for(status_is(job, JobStatus.FAILED), what="the job to end")
    wait_for(
        lambda: not RankRun.objects.filter(job=job, state=RankState.STARTED).exists(), what="every rank gone"
    )
    exits = set(RankRun.objects.filter(job=job).values_list("exit_code", "log_tail"))
    # Reported lost as this server's work and stop lists name them, never as ranks the agent
    # stopped through their cgroups (their records were another server's).
    assert exits <= {
        (255, "lost: the node agent lost its state"),
        (255, "lost: the node agent has no record of this rank and no process of it runs"),
    }, exits
    assert json.loads(identity.read_text())["server"] == mine["server"]
    assert "recorded for server 0ther5e7" in (tmp_path / f"agent-{node}.out").read_text()


def test_a_second_agent_on_the_node_credential_is_refused_and_the_ranks_run_once(
    agents,  # noqa: F811
    user,  # noqa: F811
    tmp_path,
):
    """A second agent with the node's token (its own state directory, the same cgroup parent, as
    a second host or a double start would have) is refused with 409: it starts nothing, stops
    nothing, and the first keeps every rank."""
    job, node, pids = _running_job(agents, user, tmp_path, "once", BEHAVIOUR="sleep", SLEEP_S="60")
    argv = agents.argv(
        node,
        extra=[
            "--state-dir",
            str(tmp_path / "state-2"),
            "--log-dir",
            str(tmp_path / "l2"),
            "--lock-dir",
            str(tmp_path / "locks-2"),
        ],
    )
    with (tmp_path / "second.out").open("wb") as out:
        second = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: NodeHealth.objects.get(node__name=node).agent_refused, timeout_s=20, what="the refusal"
        )
        time.sleep(3)
        assert second.poll() is None
    finally:
        second.terminate()
        second.wait(timeout=20)
    text = (tmp_path / "second.out").read_text()
    assert "the server refused this agent" in text and "has a live agent already" in text
    assert text.count("the server refused this agent") == 1
    assert all(_alive(p) for p in pids.values())
    envs = [e for e in _live_rank_envs(str(tmp_path)) if e["TOPOWEB_JOB_ID"] == str(job.pk)]
    assert sorted(int(e["RANK"]) for e in envs) == sorted(pids)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    refused = NodeHealth.objects.get(node__name=node).agent_refused
    assert refused["addr"] == "127.0.0.1" and refused["at"]


def test_a_second_agent_on_the_same_state_directory_exits_at_once(agents, tmp_path):  # noqa: F811
    agents.start("node-a")
    wait_for(lambda: (tmp_path / "state-node-a" / "agent.lock").exists(), what="the first agent's lock")
    second = subprocess.run(agents.argv("node-a"), cwd=REPO, capture_output=True, text=True, timeout=30)
    assert second.returncode == 75
    assert f"pid {agents.procs['node-a'].pid}" in second.stderr
    assert agents.procs["node-a"].poll() is None


def test_a_rank_recorded_without_its_shim_is_re_adopted_by_its_running_shim(
    agents,  # noqa: F811
    user,  # noqa: F811
    tmp_path,
):
    """As an agent killed between starting a rank's shim and recording it leaves it: a record
    without shim pid, the rank live in its cgroup. The restarted agent watches it through its
    cgroup and shim: it runs to its end and the job completes (its exit code from the shim)."""
    job, node, pids = _running_job(agents, user, tmp_path, "half", BEHAVIOUR="sleep", SLEEP_S="10")
    agents.kill(node)
    for path in (tmp_path / f"state-{node}").glob("job-*/rank.json"):
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "shim_pid": None, "shim_start": ""}))
    agents.start(node)
    time.sleep(3)
    assert all(_alive(p) for p in pids.values())
    wait_for(status_is(job, JobStatus.COMPLETED, JobStatus.FAILED), timeout_s=30, what="the job to end")
    assert job.status == JobStatus.COMPLETED, job.pending_reason
    assert set(RankRun.objects.filter(job=job).values_list("state", "exit_code")) == {(RankState.EXITED, 0)}
    assert "re-adopted by its running shim" in (tmp_path / f"agent-{node}.out").read_text()
    assert os.path.exists(tmp_path / f"state-{node}" / "identity.json")

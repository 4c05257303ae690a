"""Trustworthy execution with real agents and processes: ranks tracked by cgroup (forked and
`setsid` children included), stopped whatever they ignore, re-adopted across agent restarts,
fenced when cut off from the server; ranks run as their owners' accounts and see only their
GPUs' device files. A watcher reads every process's environment each 0.2 s throughout and fails
on any (node, GPU) used by two jobs' live processes."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from apps.executors.agents import services as agent_services
from apps.scheduling import nodes, services
from apps.scheduling.choices import JobStatus, NodeState
from apps.scheduling.models import NodeHealth, RankRun, UnixAccount
from apps.scheduling.selectors import job_ranks
from apps.topology.models import Node

from .agents import FENCED, TcpProxy, cgroups_writable, gpu_use_watch, recorded
from .test_agents import agents, cluster, eager_cycles, spec, status_is, user  # noqa: F401
from .test_scheduling_postgres import wait_for


def not_in_ci(missing: bool) -> bool:
    """Skip for a missing facility on a developer's machine; under CI (root, cgroups, useradd) run
    anyway, so that a missing facility fails the test instead of hiding it."""
    return missing and os.environ.get("CI") != "true"


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not_in_ci(not cgroups_writable()), reason="needs root and a writable cgroup hierarchy"
    ),
]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


# Until the job under test runs, a lease no loaded machine's slow answer outlasts: at load 12 the
# agent's first answer came 5 s after its request left, and a 2 s lease from it fenced the job
# before the fault the test injects.
LONG_LEASE_S = 120.0


def shorten_lease(agents, settings, node: str, lease_s: float = 2.0) -> None:
    """Give the agents `lease_s` from now on, and wait until `node`'s agent took it from an answer."""
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = lease_s
    wait_for(
        lambda: agents.lease_s(node) == lease_s, what=f"node {node}'s agent to take a {lease_s:g} s lease"
    )


def _drain_other(cluster, keep: str) -> None:
    """Only node `keep` takes placements (the others drained)."""
    for node in Node.objects.filter(cluster=cluster).exclude(name=keep):
        nodes.node_drain(node=node, reason="test: one node only")


def _v2_writable() -> bool:
    from apps.agent.cgroups import CgroupError, detect

    try:
        found = detect("v2", "topoweb-probe")
    except CgroupError:
        return False
    found.parents[0].rmdir()
    return True


@pytest.mark.parametrize("hierarchy", ["auto", "v2"])
def test_a_rank_that_forks_and_setsids_children_then_exits(agents, cluster, user, tmp_path, hierarchy):
    """The rank's main process exits 0 at once, leaving a `setsid` child ignoring SIGTERM and a
    forked child: the rank has not exited until both are gone (killed after the grace period),
    and the next job gets the GPUs only then. On cgroup v2 too, where the host has it writable."""
    if hierarchy == "v2" and not_in_ci(not _v2_writable()):
        pytest.skip("no writable cgroup v2 hierarchy")
    for node in ("node-a", "node-b"):
        agents.start(node, extra=["--cgroups", hierarchy])
    with gpu_use_watch(tmp_path) as use:
        first = services.job_submit(
            user=user, spec={**spec(tmp_path, "forks", 16, BEHAVIOUR="fork"), "stop_grace_s": 1}
        )
        wait_for(lambda: len(list((tmp_path / "out").glob("children-1-*"))) == 16, what="children recorded")
        children = [int(p) for f in (tmp_path / "out").glob("children-1-*") for p in f.read_text().split()]
        assert len(children) == 32
        second = services.job_submit(user=user, spec=spec(tmp_path, "next", 16, BEHAVIOUR="exit"))
        wait_for(status_is(first, JobStatus.COMPLETED, JobStatus.FAILED), what="the first job to end")
        assert first.status == JobStatus.COMPLETED, first.pending_reason
        # Completed only once every child was gone.
        assert not any(_alive(p) for p in children)
        wait_for(status_is(second, JobStatus.COMPLETED, JobStatus.FAILED), what="the second job to end")
        assert second.status == JobStatus.COMPLETED, second.pending_reason
    assert use.samples > 5 and not use.violations, use.violations
    assert second.placed_at >= first.finished_at
    assert set(RankRun.objects.filter(job=first).values_list("exit_code", flat=True)) == {0}


def test_cancel_of_ranks_that_ignore_sigterm(agents, cluster, user, tmp_path):
    """SIGTERM is ignored: after stop_grace_s every process of the rank is killed, and only then
    are the GPUs handed to the next job. The watcher samples every 0.2 s, so the last sample that
    saw the ranks alive may precede the kill by a period and two scans: the check allows 0.5 s of
    the 2 s grace for that, far from a kill without grace (seen at most a period after cancel)."""
    for node in ("node-a", "node-b"):
        agents.start(node)
    with gpu_use_watch(tmp_path) as use:
        deaf = services.job_submit(
            user=user, spec={**spec(tmp_path, "deaf", 16, BEHAVIOUR="deaf"), "stop_grace_s": 2}
        )
        wait_for(status_is(deaf, JobStatus.RUNNING), what="running")
        nxt = services.job_submit(user=user, spec=spec(tmp_path, "next", 16, BEHAVIOUR="exit"))
        cancelled_at = time.time()
        services.job_cancel(job=deaf, user=user)
        wait_for(status_is(nxt, JobStatus.COMPLETED, JobStatus.FAILED), what="the next job to run")
        assert nxt.status == JobStatus.COMPLETED
    assert not use.violations, use.violations
    assert use.last_seen[deaf.pk] >= cancelled_at + 2 - 0.5
    assert set(RankRun.objects.filter(job=deaf).values_list("exit_code", flat=True)) == {-9}


@pytest.mark.parametrize("how", ["kill", "terminate"])
def test_an_agent_restarted_mid_job_readopts_its_ranks(agents, cluster, user, tmp_path, how):
    """SIGKILL (a crash) or SIGTERM (systemctl restart) of the agent: its ranks keep running, the
    restarted agent re-adopts them by cgroup and reports them, the job completes, and no other
    job is placed on their GPUs meanwhile."""
    _drain_other(cluster, "node-a")
    agents.start("node-a")
    with gpu_use_watch(tmp_path) as use:
        job = services.job_submit(
            user=user, spec={**spec(tmp_path, "long", 8, BEHAVIOUR="sleep", SLEEP_S="6"), "requeue": True}
        )
        wait_for(status_is(job, JobStatus.RUNNING), what="running")
        waiting = services.job_submit(user=user, spec=spec(tmp_path, "waiting", 4, BEHAVIOUR="exit"))
        pids = {e["pid"] for e in recorded(tmp_path / "out", 1).values()}
        if how == "kill":
            agents.kill("node-a")
        else:
            assert agents.terminate("node-a") == 0
        assert all(_alive(p) for p in pids)
        time.sleep(1.0)
        agents.start("node-a")
        wait_for(
            status_is(job, JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.QUEUED), what="the job to end"
        )
        assert job.status == JobStatus.COMPLETED, job.pending_reason
        assert job.generation == 1 and not job.requeue_reason
        wait_for(status_is(waiting, JobStatus.COMPLETED, JobStatus.FAILED), what="the waiting job")
    assert not use.violations, use.violations
    assert waiting.placed_at >= job.finished_at
    assert set(RankRun.objects.filter(job=job).values_list("exit_code", flat=True)) == {0}
    log = (tmp_path / "agent-node-a.out").read_text()
    assert "re-adopted rank" in log


def test_a_partitioned_agent_is_fenced_and_its_gpus_reused_only_after(
    agents, cluster, user, tmp_path, settings
):
    """SIGSTOP the agent past its lease: the server keeps its GPUs booked (no other node answers,
    so the silence is not blamed on it, and its fence deadline is far); the agent, continued,
    finds its lease expired and stops its ranks (they ignore SIGTERM for 2 s); the node's GPUs
    take new work only after it reported them gone."""
    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 3.0
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = LONG_LEASE_S
    _drain_other(cluster, "node-a")
    agent = agents.start("node-a")
    with gpu_use_watch(tmp_path) as use:
        body = {**spec(tmp_path, "cut-off", 8, BEHAVIOUR="stubborn", STUBBORN_S="2"), "stop_grace_s": 5}
        job = services.job_submit(user=user, spec=body)
        wait_for(status_is(job, JobStatus.RUNNING), what="running")
        shorten_lease(agents, settings, "node-a")
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            time.sleep(3.0)
            agent_services.nodes_check(cluster=cluster)
            job.refresh_from_db()
            assert job.status == JobStatus.RUNNING, job.pending_reason
            nxt = services.job_submit(user=user, spec=spec(tmp_path, "after", 8, BEHAVIOUR="exit"))
            nxt.refresh_from_db()
            assert nxt.status == JobStatus.QUEUED
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        log = tmp_path / "agent-node-a.out"
        wait_for(lambda: FENCED in log.read_text(), timeout_s=30, what="the agent to fence its ranks")
        # The next job runs on a lease no busy machine's slow sync can outlast (a 2 s one fenced it
        # at load 15); the agent takes it from its next answer.
        settings.TOPOWEB_AGENT_FENCE_AFTER_S = LONG_LEASE_S
        wait_for(status_is(nxt, JobStatus.COMPLETED, JobStatus.FAILED), timeout_s=120, what="the next job")
    assert not use.violations, use.violations
    assert nxt.status == JobStatus.COMPLETED, nxt.pending_reason
    # The fenced ranks took their 2 s checkpoint first: the next job came after their end.
    assert use.last_seen[job.pk] <= nxt.placed_at.timestamp() + 0.3
    assert NodeHealth.objects.get(node__name="node-a", node__cluster=cluster).state == NodeState.UP


def test_a_partition_by_a_cut_connection_fences_the_ranks(
    agents, cluster, user, tmp_path, settings, live_server
):
    """The agent reaches the server through a TCP proxy that is cut past the down time: the
    agent fences its ranks on its own; healed, the node takes new work once they are gone."""
    from urllib.parse import urlsplit

    settings.TOPOWEB_AGENT_DOWN_AFTER_S = 3.0
    settings.TOPOWEB_AGENT_FENCE_AFTER_S = LONG_LEASE_S
    _drain_other(cluster, "node-a")
    where = urlsplit(live_server.url)
    proxy = TcpProxy((where.hostname, where.port))
    agents.start("node-a", server=proxy.url)
    log = tmp_path / "agent-node-a.out"
    try:
        with gpu_use_watch(tmp_path) as use:
            body = {**spec(tmp_path, "cut", 8, BEHAVIOUR="stubborn", STUBBORN_S="1"), "stop_grace_s": 5}
            job = services.job_submit(user=user, spec=body)
            wait_for(status_is(job, JobStatus.RUNNING), what="running")
            shorten_lease(agents, settings, "node-a")
            proxy.cut()
            wait_for(lambda: FENCED in log.read_text(), timeout_s=15, what="the agent to fence its ranks")
            # No other node answers: the server does not blame the node; its GPUs stay booked.
            assert agent_services.nodes_check(cluster=cluster)["down"] == []
            nxt = services.job_submit(user=user, spec=spec(tmp_path, "after", 8, BEHAVIOUR="exit"))
            nxt.refresh_from_db()
            assert nxt.status == JobStatus.QUEUED
            # The next job runs on a lease no busy machine's slow sync can outlast (a 2 s one fenced
            # it at load 15); the agent takes it from its first answer once healed.
            settings.TOPOWEB_AGENT_FENCE_AFTER_S = LONG_LEASE_S
            proxy.heal()
            wait_for(
                status_is(nxt, JobStatus.COMPLETED, JobStatus.FAILED), timeout_s=120, what="the next job"
            )
    finally:
        proxy.close()
    assert not use.violations, use.violations
    assert nxt.status == JobStatus.COMPLETED, nxt.pending_reason
    assert use.last_seen[job.pk] <= nxt.placed_at.timestamp() + 0.3


@pytest.fixture
def shared_dir():
    """A folder every account can reach (pytest's own is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="topoweb-isolation-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def unix_users(shared_dir):
    """Two Unix accounts made for the test (removed after), with homes in `shared_dir`."""
    if not_in_ci(shutil.which("useradd") is None):
        pytest.skip("needs useradd")
    names = [f"twa{os.getpid() % 100000}", f"twb{os.getpid() % 100000}"]
    for name in names:
        home = shared_dir / f"home-{name}"
        subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", name], check=True)
        home.mkdir()
        shutil.chown(home, name, name)
    yield names
    for name in names:
        subprocess.run(["userdel", "-f", name], check=False, capture_output=True)


def test_two_owners_ranks_run_as_their_accounts_and_cannot_touch_each_other(
    agents, cluster, user, tmp_path, shared_dir, unix_users
):
    from django.contrib.auth import get_user_model

    acct_a, acct_b = unix_users
    bob = get_user_model().objects.create_user("bob", password="pw")
    carol = get_user_model().objects.create_user("carol", password="pw")
    UnixAccount.objects.create(user=user, name=acct_a)
    UnixAccount.objects.create(user=bob, name=acct_b)
    UnixAccount.objects.create(user=carol, name="twnobody-here")
    out, spy_out = shared_dir / "out-a", shared_dir / "out-b"
    for folder in (out, spy_out):
        folder.mkdir()
        folder.chmod(0o777)
    logs = shared_dir / "logs"
    _drain_other(cluster, "node-a")
    agents.start("node-a", multi_user=True, extra=["--log-dir", str(logs)])
    with gpu_use_watch(shared_dir) as use:
        body = spec(tmp_path, "alice-job", 4, BEHAVIOUR="sleep", SLEEP_S="30")
        body["env"]["OUT_DIR"] = str(out)
        first = services.job_submit(user=user, spec=body)
        wait_for(lambda: len(recorded(out, 1)) == 4, what="alice's ranks to record")
        victim = recorded(out, 1)[0]
        victim_log = logs / f"job-{first.pk}-gen-1-rank-0.log"
        body = spec(tmp_path, "bob-job", 4, BEHAVIOUR="spy", SLEEP_S="0.1")
        body["env"].update(OUT_DIR=str(spy_out), SPY_LOG=str(victim_log), SPY_PID=str(victim["pid"]))
        second = services.job_submit(user=bob, spec=body)
        wait_for(status_is(second, JobStatus.COMPLETED, JobStatus.FAILED), what="bob's job")
        assert second.status == JobStatus.COMPLETED, second.pending_reason
        third = services.job_submit(user=carol, spec=spec(tmp_path, "carol-job", 4, BEHAVIOUR="exit"))
        wait_for(status_is(third, JobStatus.FAILED, JobStatus.COMPLETED), what="carol's job")
        services.job_cancel(job=first, user=user)
        wait_for(
            lambda: RankRun.objects.filter(job=first, exit_code__isnull=False).count() == 4,
            what="alice's ranks to stop",
        )
    assert not use.violations, use.violations
    assert "twnobody-here" in third.pending_reason and "does not exist on node node-a" in third.pending_reason
    uid_a, uid_b = (pwd.getpwnam(n).pw_uid for n in unix_users)
    spies = recorded(spy_out, 1)
    assert len(spies) == 4
    for seen in spies.values():
        assert seen["uid"] == uid_b
        assert seen["read_other_log"] == "EACCES" and seen["signal_other"] == "EPERM"
    assert {e["uid"] for e in recorded(out, 1).values()} == {uid_a}
    for job, uid in ((first, uid_a), (second, uid_b)):
        for rank in range(4):
            st = (logs / f"job-{job.pk}-gen-1-rank-{rank}.log").stat()
            assert st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o600
    # Alice's rank was not signalled by Bob: it ran until cancelled.
    assert set(RankRun.objects.filter(job=first).values_list("exit_code", flat=True)) == {-15}


@pytest.mark.skipif(
    not_in_ci(not Path("/sys/fs/cgroup/devices").is_dir()), reason="needs the v1 devices controller"
)
def test_a_rank_cannot_open_a_gpu_device_it_was_not_given(agents, cluster, user, tmp_path):
    """Stand-ins for /dev/nvidia0-7 (character devices without a driver: ENXIO when allowed);
    the rank's cgroup denies the GPUs it was not planned on (EPERM)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for index in range(8):
        os.mknod(dev / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(195, index))
    _drain_other(cluster, "node-a")
    agents.start("node-a", extra=["--dev-dir", str(dev)])
    job = services.job_submit(
        user=user, spec=spec(tmp_path, "devices", 3, BEHAVIOUR="devices", DEV_DIR=str(dev))
    )
    wait_for(status_is(job, JobStatus.COMPLETED, JobStatus.FAILED), what="the job")
    assert job.status == JobStatus.COMPLETED, job.pending_reason
    seen = recorded(tmp_path / "out", 1)
    planned = {int(g) for g in seen[0]["CUDA_VISIBLE_DEVICES"].split(",")}
    assert len(planned) == 3 and {r["gpu"] for r in job_ranks(job=job)} == planned
    for env in seen.values():
        for index in range(8):
            assert env["devices"][f"nvidia{index}"] == ("ENXIO" if index in planned else "EPERM"), env

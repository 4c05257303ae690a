"""Stopping a rank: a process that joins the rank's cgroup after the stop began is stopped too."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from apps.agent.cgroups import RankCgroup
from apps.agent.env import RankPlan
from apps.agent.runner import Agent, LocalRank, RankStatus


def run_loop(main):
    """`asyncio.run(main())` on a thread of its own (a browser test of the suite may have left an
    event loop running on this one)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(main())).result()


def make_agent(tmp_path: Path, cgroups=None, **kw) -> Agent:
    """A single-user agent (ranks run as this user, root allowed) logging under `tmp_path`."""
    return Agent(
        server="http://topoweb",
        node="n",
        token="k",
        log_dir=tmp_path / "logs",
        cgroups=cgroups,
        single_user=True,
        allow_root=True,
        **kw,
    )


class LateCgroup:
    """A rank cgroup the rank's process joins only when `joined` is set, as when the shim forked
    the rank but the child has not yet written itself to cgroup.procs."""

    version = 2

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.joined = False

    def pids(self) -> set[int]:
        return {self.proc.pid} if self.joined and self.proc.poll() is None else set()

    def empty(self) -> bool:
        return not self.pids()

    def kill(self) -> None:
        if self.pids():
            self.proc.kill()

    signal = RankCgroup.signal


def test_a_rank_that_joins_its_cgroup_after_the_stop_began_is_stopped(tmp_path: Path):
    """The stop of a rank whose shim forked it a moment ago does not take the empty cgroup for a
    stopped rank: the main process has not exited, and it gets SIGTERM once it joined."""
    rank = subprocess.Popen(["sleep", "60"])
    try:
        cgroup = LateCgroup(rank)
        agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path)
        local = LocalRank(
            (1, 0, 0),
            RankPlan(rank=0, local_rank=0, gpu=0, env={}),
            tmp_path / "rank.log",
            5.0,
            tmp_path,
            cgroup=cgroup,
        )
        # The shim is alive (it waits for its child): here the rank process stands in for it.
        local.shim_pid = rank.pid
        local.status = RankStatus.STOPPING

        async def stop_then_join():
            stopping = asyncio.ensure_future(agent._stop_rank(local))
            await asyncio.sleep(0.3)
            assert not stopping.done(), "the stop ended while the rank's main process still ran"
            cgroup.joined = True
            await asyncio.wait_for(stopping, timeout=4.0)

        run_loop(stop_then_join)
        assert rank.wait(timeout=1) == -15
    finally:
        rank.kill()
        rank.wait()


def _cgroups(name: str):
    """The agent's cgroups under `name` where this process may create them (root, as CI), else None."""
    from apps.agent.cgroups import CgroupError, detect

    if os.geteuid() != 0:
        return None
    try:
        return detect("auto", name)
    except CgroupError:
        return None


def _required_cgroups(name: str):
    """`_cgroups(name)`, or the test is skipped (failed on CI, which runs as root with them)."""
    cgroups = _cgroups(name)
    if cgroups is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root with a writable cgroup hierarchy")
        pytest.skip("needs root and a writable cgroup hierarchy")
    return cgroups


def test_a_rank_stopped_the_moment_it_was_started_does_not_run_on(tmp_path: Path):
    """A real rank under its shim and cgroup, stopped right after the agent started it (its job
    failed meanwhile): the stop waits for the shim's child to join the cgroup and stops it, so
    the rank's exit is reported within its grace period rather than when it ends by itself."""
    cgroups = _required_cgroups(f"topoweb-unit-{os.getpid()}")
    agent = make_agent(tmp_path, cgroups)
    key = (1, 0, 0)
    entry = {"command": ["sleep", "60"], "stop_grace_s": 5}
    plan = RankPlan(rank=0, local_rank=0, gpu=0, env={"CUDA_VISIBLE_DEVICES": "0"})

    async def start_then_stop():
        agent.log_dir.mkdir(parents=True)
        agent.state_dir.mkdir(parents=True)
        agent._wake = asyncio.Event()
        await agent._start(key, plan, entry)
        local = agent.ranks[key]
        agent._begin_stop(local)
        await asyncio.wait_for(asyncio.gather(*local.tasks), timeout=10.0)
        return local

    try:
        local = run_loop(start_then_stop)
        assert local.status is RankStatus.EXITED
        assert agent.outbox[(*key, "exited")]["exit_code"] == -15
    finally:
        for local in agent.ranks.values():
            if local.cgroup is not None:
                local.cgroup.kill()
                local.cgroup.remove()
        for parent in cgroups.parents:
            parent.rmdir()


@pytest.mark.parametrize("tracking", ["cgroup", "process group"])
def test_a_rank_fenced_while_its_shim_is_being_started_is_stopped_once_it_exists(
    tmp_path: Path, monkeypatch, tracking
):
    """The lease runs out while the agent starts a rank (its answer came late on a busy machine):
    the fence's stop begins before the shim exists. It must not take the rank for gone (no
    process, no exit file yet) and leave it running unfenced: once the shim started it, the rank
    gets its SIGTERM, and its exit is reported fenced, within its grace."""
    from apps.agent import runner

    cgroups = None
    if tracking == "cgroup":
        cgroups = _required_cgroups(f"topoweb-unit-fence-{os.getpid()}")
    agent = make_agent(tmp_path, cgroups)
    key = (1, 1, 1)
    plan = RankPlan(rank=1, local_rank=1, gpu=1, env={"CUDA_VISIBLE_DEVICES": "1"})
    spawn = asyncio.create_subprocess_exec

    async def fenced_during_spawn(*args, **kwargs):
        # The lease ran out while the shim is being started: the fence watch fires now.
        agent.fence_after_s = 2.0
        agent._last_ok = time.monotonic() - 5.0
        agent._check_fence()
        assert agent.ranks[key].status is RankStatus.STOPPING
        await asyncio.sleep(0.3)  # the stop runs before the shim exists
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(runner.asyncio, "create_subprocess_exec", fenced_during_spawn)

    async def start():
        agent.log_dir.mkdir(parents=True)
        agent.state_dir.mkdir(parents=True)
        agent._wake = asyncio.Event()
        await agent._start(key, plan, {"command": ["sleep", "60"], "stop_grace_s": 5})
        local = agent.ranks[key]
        await asyncio.wait_for(asyncio.gather(*local.tasks), timeout=10.0)
        return local

    try:
        local = run_loop(start)
        report = agent.outbox[(*key, "exited")]
        assert report["cause"] == runner.FENCED and "fenced" in report["log_tail"]
        if tracking == "cgroup":
            # SIGTERM goes to the cgroup's members: the rank, once it joined (its handler reset).
            assert report["exit_code"] == -15
            assert local.cgroup.empty()
        else:
            # SIGTERM goes to the shim's process group: it may reach the shim before the shim
            # ignores it, and then nothing ran and the exit is unknown (255).
            assert report["exit_code"] in (-15, 255)
            with pytest.raises(ProcessLookupError):
                os.killpg(local.shim_pid, 0)
    finally:
        local = agent.ranks.get(key)
        if local is not None and local.cgroup is not None:
            local.cgroup.kill()
            local.cgroup.remove()
        elif local is not None and local.shim_pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(local.shim_pid, signal.SIGKILL)
        for parent in cgroups.parents if cgroups is not None else ():
            parent.rmdir()


def test_a_rank_the_server_asks_to_stop_that_the_agent_has_no_trace_of_is_reported_gone(tmp_path: Path):
    """The server still counts a rank running (its GPU booked) that this agent never had, or lost
    with its state: the agent reports it gone, so the GPU is not booked for good."""
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path)

    async def answer():
        agent._wake = asyncio.Event()
        await agent._reconcile([], [[5, 1, 3]])

    run_loop(answer)
    report = agent.outbox[(5, 1, 3, "exited")]
    assert report["exit_code"] == 255 and "no record" in report["log_tail"]


def test_a_rank_without_a_record_whose_cgroup_holds_processes_is_stopped_before_it_is_reported(
    tmp_path: Path, monkeypatch
):
    """A rank the server asks to stop, with no record but processes still in its cgroup (its record
    was lost while it ran): they are stopped first, and only then is the rank reported gone."""
    from apps.agent import runner

    cgroups = _required_cgroups(f"topoweb-unit-orphan-{os.getpid()}")
    monkeypatch.setattr(runner, "ORPHAN_GRACE_S", 0.5)
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path, cgroups=cgroups)
    group = cgroups.create("job-5-gen-1-rank-3")
    # A rank that ignores SIGTERM: only the kill after the grace period ends it.
    ready = tmp_path / "ready"
    orphan = subprocess.Popen(["sh", "-c", f"trap '' TERM; touch {ready}; while :; do sleep 0.1; done"])
    try:
        for procs in group.procs_files():
            Path(procs).write_text(str(orphan.pid))
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

        async def answer():
            agent._wake = asyncio.Event()
            await agent._reconcile([], [[5, 1, 3]])
            assert (5, 1, 3, "exited") not in agent.outbox, "reported gone while its processes ran"
            await asyncio.wait_for(agent.orphans[(5, 1, 3)], timeout=10.0)

        run_loop(answer)
        assert orphan.wait(timeout=2) == -9
        assert not Path(f"/proc/{orphan.pid}").exists() or orphan.returncode is not None
        assert agent.outbox[(5, 1, 3, "exited")]["exit_code"] == 255
        assert not group.exists()
    finally:
        orphan.kill()
        orphan.wait()
        group.kill()
        group.remove()
        for parent in cgroups.parents:
            parent.rmdir()


def test_a_ranks_cgroup_caps_its_processes_so_a_fork_bomb_stops_there(tmp_path: Path):
    """pids.max on the rank's cgroup: a rank that forks 60 children gets at most the limit."""
    cgroups = _required_cgroups(f"topoweb-unit-pids-{os.getpid()}")
    group = cgroups.create("job-7-gen-1-rank-0")
    try:
        assert group.limit_pids(20)
        forker = (
            "import os, sys, time\n"
            "for procs in sys.argv[1:]:\n"
            "    open(procs, 'w').write(str(os.getpid()))\n"
            "made = 0\n"
            "for _ in range(60):\n"
            "    try:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(5)\n"
            "            os._exit(0)\n"
            "        made += 1\n"
            "    except OSError:\n"
            "        pass\n"
            "print(made, flush=True)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", forker, *group.procs_files()], capture_output=True, text=True, timeout=30
        )
        made = int(out.stdout.strip())
        assert 0 < made < 20, out.stderr
    finally:
        group.kill()
        for _ in range(100):
            if group.empty():
                break
            time.sleep(0.05)
        group.remove()
        for parent in cgroups.parents:
            parent.rmdir()

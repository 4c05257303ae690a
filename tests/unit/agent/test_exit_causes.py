"""Why a rank exited, as the agent reports it (`cause`): its own exit, a limit of its cgroup, a
refused start, fenced, stopped, lost; and a killed shim leaves its rank running. Real processes,
checked from /proc; the cgroup cases need root and a writable hierarchy (as CI has)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import httpx
import pytest

from apps.agent import runner
from apps.agent.env import RankPlan
from apps.agent.runner import LOST_EXIT, WAITING_RECHECK_S, Agent, RankStatus, process_start

from .test_stop import _required_cgroups, make_agent, run_loop

KEY = (4, 1, 0)
PLAN = RankPlan(rank=0, local_rank=0, gpu=0, env={"CUDA_VISIBLE_DEVICES": "0"})


@pytest.fixture
def cgroups():
    found = _required_cgroups(f"topoweb-unit-causes-{os.getpid()}")
    yield found
    for parent in found.parents:
        for child in parent.iterdir() if parent.is_dir() else ():
            if child.is_dir():
                child.rmdir()
        parent.rmdir()


def prepare(agent: Agent) -> None:
    agent.log_dir.mkdir(parents=True, exist_ok=True)
    agent.state_dir.mkdir(parents=True, exist_ok=True)
    agent._wake = asyncio.Event()


async def wait_exited(agent: Agent, key=KEY, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while (*key, "exited") not in agent.outbox:
        assert time.monotonic() < deadline, "no exit reported"
        await asyncio.sleep(0.05)
    return agent.outbox[(*key, "exited")]


def cleanup(agent: Agent) -> None:
    for local in agent.ranks.values():
        if local.cgroup is not None:
            local.cgroup.kill()
            for _ in range(100):
                if local.cgroup.empty():
                    break
                time.sleep(0.05)
            local.cgroup.remove()
        elif local.shim_pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(local.shim_pid, signal.SIGKILL)


def _group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def test_the_ranks_own_exit_is_exited(tmp_path: Path):
    agent = make_agent(tmp_path)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": ["sh", "-c", "exit 3"]})
        return await wait_exited(agent)

    report = run_loop(main)
    assert report["exit_code"] == 3 and report["cause"] == "exited"


def test_a_refused_start_is_refused(tmp_path: Path):
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path / "logs")

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": ["true"], "account": ""})

    run_loop(main)
    report = agent.outbox[(*KEY, "exited")]
    assert report["cause"] == "refused" and "no Unix account" in report["log_tail"]


def test_a_rank_no_longer_wanted_is_stopped(tmp_path: Path):
    agent = make_agent(tmp_path)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": ["sleep", "60"], "stop_grace_s": 5})
        # Running (past the shim's start, which a SIGTERM to its process group would end).
        await asyncio.sleep(0.5)
        await agent._reconcile([], [])
        return await wait_exited(agent)

    report = run_loop(main)
    assert report["cause"] == "stopped" and report["exit_code"] == -15


def _work(job: int, gpu: int) -> dict:
    """A work entry of job `job`, generation 1: one rank, on GPU `gpu`, sleeping."""
    return {
        "job": job,
        "generation": 1,
        "command": ["sleep", "60"],
        "env": {},
        "world_size": 1,
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "node_rank": 0,
        "ranks": [{"rank": 0, "gpu": gpu}],
    }


SLOW_STOP = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), sys.exit(3)))\ntime.sleep(60)"


def test_a_rank_waits_for_its_gpus_while_another_jobs_rank_on_them_is_stopped(tmp_path: Path):
    """Job 4's rank runs on GPU 0 when the work no longer lists it and gives GPU 0 to job 5 (as
    when job 4 was cancelled before its start was reported: the server freed the GPU). Job 4's
    rank is stopped (its SIGTERM handler takes a second); job 5's starts only once it is gone,
    at the next sync. Job 6, on GPU 1, starts at once."""
    agent = make_agent(tmp_path)
    job5, job6 = (5, 1, 0), (6, 1, 0)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": [sys.executable, "-c", SLOW_STOP], "stop_grace_s": 10})
        await asyncio.sleep(0.5)
        await agent._reconcile([_work(5, 0), _work(6, 1)])
        assert job5 not in agent.ranks and job6 in agent.ranks
        assert agent.ranks[KEY].status is RankStatus.STOPPING
        holder = agent.ranks[KEY].shim_pid
        report = await wait_exited(agent)
        assert not _group(holder)
        await agent._reconcile([_work(5, 0), _work(6, 1)])
        assert job5 in agent.ranks
        return report

    try:
        report = run_loop(main)
    finally:
        cleanup(agent)
    assert report["cause"] == "stopped" and report["exit_code"] == 3


def test_an_agent_whose_ranks_wait_for_their_gpus_does_not_sync_in_a_loop(tmp_path: Path):
    """The server answers at once a sync of an agent that runs less than its work (it long-polls
    otherwise, as the fake server here does). While job 5's rank waits 3 s for its GPU (job 4's
    rank, no longer listed, takes that long to stop) the agent syncs about once a second and once
    at the holder's exit, not in a loop; then job 5 starts."""
    from .test_state import SERVER  # (test_state imports this module's helpers)

    agent = make_agent(tmp_path, state_dir=tmp_path / "state", poll_s=1.0)
    ready = tmp_path / "ready"
    slow = SLOW_STOP.replace("time.sleep(1)", "time.sleep(3)").replace(
        "time.sleep(60)", "open(sys.argv[1], 'w').close()\ntime.sleep(60)"
    )
    holder = {**_work(4, 0), "command": [sys.executable, "-c", slow, str(ready)], "stop_grace_s": 30}
    moved: list[float] = []
    syncs: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        running = {tuple(k) for k in body["running"]}
        if not moved and KEY in running and ready.exists():  # its SIGTERM handler installed
            moved.append(time.monotonic())
        work = [_work(5, 0)] if moved else [holder]
        if moved:
            syncs.append(time.monotonic())
        if (5, 1, 0) in agent.ranks:
            agent.stop()
        elif body["wait_s"] and not body["reports"] and running == {(w["job"], 1, 0) for w in work}:
            await asyncio.sleep(body["wait_s"])
        return httpx.Response(200, json={**SERVER, "work": work, "stop": []})

    async def main():
        await asyncio.wait_for(agent.run(), timeout=60)

    real = httpx.AsyncClient
    try:
        with mock.patch.object(
            runner.httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
        ):
            run_loop(main)
    finally:
        cleanup(agent)
    assert (5, 1, 0) in agent.ranks and moved
    waited = syncs[-1] - moved[0]
    assert 2.5 < waited < 30, waited
    assert len(syncs) <= waited / WAITING_RECHECK_S + 6, len(syncs)


def test_a_fenced_rank_reports_fenced_with_the_note(tmp_path: Path):
    agent = make_agent(tmp_path, fence_after_s=1.0)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": ["sleep", "60"], "stop_grace_s": 5})
        await asyncio.sleep(0.5)
        agent._last_ok = time.monotonic() - 10
        agent._check_fence()
        return await wait_exited(agent)

    try:
        report = run_loop(main)
    finally:
        cleanup(agent)
    assert report["cause"] == "fenced" and report["exit_code"] == -15
    assert report["log_tail"].splitlines()[-1].startswith("fenced: the node agent had no contact")


RELEASE = "echo $$ > {go}.pid; while [ ! -e {go} ]; do sleep 0.05; done; echo done; exit 7"


def test_a_killed_shim_leaves_its_rank_running_until_it_ends_then_it_is_lost(tmp_path: Path, cgroups):
    """SIGKILL to the shim (the rank's parent): the rank runs on, watched through its cgroup; once
    it ended on its own the exit is reported lost (its status is unknowable) with a note."""
    agent = make_agent(tmp_path, cgroups)
    go = tmp_path / "go"

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": ["sh", "-c", RELEASE.format(go=go)], "stop_grace_s": 5})
        local = agent.ranks[KEY]
        pidfile = Path(f"{go}.pid")
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline, "the rank did not start"
            await asyncio.sleep(0.05)
        rank_pid = int(pidfile.read_text())
        assert rank_pid in local.cgroup.pids()
        os.kill(local.shim_pid, signal.SIGKILL)
        await asyncio.sleep(1.5)
        assert local.status is RankStatus.RUNNING and local.shim_lost
        assert _running(rank_pid), "the agent stopped a healthy rank whose shim was killed"
        assert (*KEY, "exited") not in agent.outbox
        go.touch()
        return await wait_exited(agent)

    try:
        report = run_loop(main)
    finally:
        cleanup(agent)
    assert report["exit_code"] == LOST_EXIT and report["cause"] == "lost"
    assert report["log_tail"].endswith("lost: its shim was killed; exit status unknown")
    assert "done" in report["log_tail"]


def test_a_re_adopted_rank_whose_shim_is_gone_runs_on(tmp_path: Path, cgroups):
    """An agent restarted after the shim was killed: the record's shim is dead, its cgroup holds
    the rank, which runs on until it ends (lost)."""
    agent = make_agent(tmp_path, cgroups)
    prepare(agent)
    group = cgroups.create("job-4-gen-1-rank-0")
    go = tmp_path / "go"
    code = (
        "import os, sys, time\n"
        "for p in sys.argv[2:]:\n"
        "    open(p, 'w').write(str(os.getpid()))\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.05)\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", code, str(go), *group.procs_files()])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        deadline = time.monotonic() + 10
        while not group.pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        record = agent.state_dir / "job-4-gen-1-rank-0"
        record.mkdir()
        data = {
            "key": list(KEY),
            "plan": {"rank": 0, "local_rank": 0, "gpu": 0, "env": {}},
            "log_path": str(agent.log_dir / "rank.log"),
            "stop_grace_s": 1.0,
            "cgroup": {"version": group.version, "dirs": [str(d) for d in group.dirs]},
            "shim_pid": dead.pid,
            "shim_start": process_start(os.getpid()),
        }
        (record / "rank.json").write_text(json.dumps(data))

        async def main():
            agent._wake = asyncio.Event()
            agent._adopt()
            local = agent.ranks[KEY]
            await asyncio.sleep(1.0)
            assert local.status is RankStatus.RUNNING
            assert rank.poll() is None
            go.touch()
            return await wait_exited(agent)

        report = run_loop(main)
        assert report["cause"] == "lost" and report["exit_code"] == LOST_EXIT
        assert rank.wait(timeout=5) == 0
    finally:
        rank.kill()
        rank.wait()
        group.kill()
        group.remove()


def test_without_cgroups_a_killed_shims_rank_is_stopped_and_lost(tmp_path: Path):
    """Without cgroups nothing but the shim's process group tracks the rank: it is stopped."""
    agent = make_agent(tmp_path)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": ["sleep", "60"], "stop_grace_s": 5})
        local = agent.ranks[KEY]
        await asyncio.sleep(0.3)
        os.kill(local.shim_pid, signal.SIGKILL)
        return await wait_exited(agent)

    report = run_loop(main)
    assert report["cause"] == "lost" and report["exit_code"] == LOST_EXIT
    assert not _group(agent.ranks[KEY].shim_pid)


FORKER = (
    "import os, sys, time\n"
    "kids = []\n"
    "for _ in range(200):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        print('fork refused', flush=True)\n"
    "        sys.exit(1)\n"
    "    if pid == 0:\n"
    "        time.sleep(30)\n"
    "        os._exit(0)\n"
    "    kids.append(pid)\n"
    "sys.exit(0)\n"
)


def test_a_rank_past_its_jobs_pids_max_ends_with_pids_limit(tmp_path: Path, cgroups):
    agent = make_agent(tmp_path, cgroups)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": [sys.executable, "-c", FORKER], "pids_max": 64})
        return await wait_exited(agent)

    try:
        report = run_loop(main)
    finally:
        cleanup(agent)
    # It exits 1 at the refused fork, unless the agent's limit check stopped it first (SIGTERM).
    assert report["cause"] == "pids_limit" and report["exit_code"] in (1, -signal.SIGTERM), report
    assert "fork refused" in report["log_tail"]


SPINNER = (
    "import os, time\n"
    "while True:\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(60)\n"
    "            os._exit(0)\n"
    "    except OSError:\n"
    "        time.sleep(0.05)\n"
)


def test_a_rank_that_forks_for_ever_is_stopped_at_its_pids_limit(tmp_path: Path, cgroups):
    """A fork bomb that retries refused forks never exits by itself: the agent stops it once its
    cgroup refused a fork, and says why."""
    agent = make_agent(tmp_path, cgroups)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": [sys.executable, "-c", SPINNER], "pids_max": 64})
        return await wait_exited(agent)

    try:
        report = run_loop(main)
    finally:
        cleanup(agent)
    assert report["cause"] == "pids_limit", report
    assert report["exit_code"] in (-signal.SIGTERM, -signal.SIGKILL), report
    assert "pids limit" in report["log_tail"]


def test_the_agents_pids_max_is_the_ceiling_of_the_jobs(tmp_path: Path, cgroups):
    agent = make_agent(tmp_path, cgroups, pids_max=64)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": ["sleep", "60"], "pids_max": 1_000_000})
        local = agent.ranks[KEY]
        limits = {
            (d / "pids.max").read_text().strip() for d in local.cgroup.dirs if (d / "pids.max").exists()
        }
        agent._begin_stop(local)
        await wait_exited(agent)
        return limits

    try:
        limits = run_loop(main)
    finally:
        cleanup(agent)
    assert limits == {"64"}


HOG = "x = []\nwhile True:\n    x.append(bytearray(16 * 1024 * 1024))\n"


def test_a_rank_past_its_jobs_memory_mb_ends_with_memory_limit(tmp_path: Path, cgroups):
    if not cgroups.memory:
        pytest.skip("no memory controller in this cgroup hierarchy")
    agent = make_agent(tmp_path, cgroups, memory_max_mb=4096)

    async def main():
        prepare(agent)
        await agent._start(KEY, PLAN, {"command": [sys.executable, "-c", HOG], "memory_mb": 64})
        return await wait_exited(agent)

    try:
        report = run_loop(main)
    finally:
        cleanup(agent)
    assert report["cause"] == "memory_limit", report
    assert report["exit_code"] != 0


def test_ranks_started_while_the_agent_is_terminated_are_stopped_and_none_starts_after(tmp_path: Path):
    """A host process ending (the demo server's stop) terminates its agents' ranks from another
    thread while a sync may be starting one: that rank gets its SIGTERM once its process exists,
    and the work of a later answer starts nothing."""
    agent = make_agent(tmp_path)

    async def main():
        prepare(agent)
        agent.terminate_ranks()  # as if it ran just before this start saw the shim's pid
        await agent._start(KEY, PLAN, {"command": ["sleep", "60"], "stop_grace_s": 5})
        report = await wait_exited(agent)
        await agent._reconcile([_work(5, 0)])
        return report, agent.ranks[KEY].shim_pid

    report, pid = run_loop(main)
    # SIGTERM may reach the shim before its rank exists: no exit code recorded then (255).
    assert report["exit_code"] in (-15, 255), report
    assert not Path(f"/proc/{pid}").exists()
    assert set(agent.ranks) == {KEY} and agent._stopping.is_set()

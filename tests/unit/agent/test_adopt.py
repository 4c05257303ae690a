"""Re-adopting recorded ranks: a recorded shim pid that now names another process (a reboot, or
the pid reused) is not taken for the rank's shim, and that process is left alone; a record without
its shim's pid is re-adopted by the shim running its spec file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from apps.agent.runner import LOST_EXIT, SHIM, Agent, RankStatus, _stat_fields, process_start

from .test_exit_causes import cleanup, prepare, wait_exited
from .test_stop import _required_cgroups, make_agent, run_loop

KEY = (7, 1, 3)


@pytest.fixture
def stranger():
    """A live process group leader that is not a rank's (its pid is what a record names)."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _record(agent: Agent, pid: int, start: str) -> None:
    """A rank record as a previous agent left it, without cgroups (its process group is the rank)."""
    record = agent.state_dir / "job-7-gen-1-rank-3"
    record.mkdir(parents=True)
    data = {
        "key": list(KEY),
        "plan": {"rank": 3, "local_rank": 0, "gpu": 0, "env": {}},
        "log_path": str(agent.log_dir / "rank.log"),
        "stop_grace_s": 1.0,
        "cgroup": None,
        "shim_pid": pid,
        "shim_start": start,
    }
    (record / "rank.json").write_text(json.dumps(data))


def _adopt_and_watch(agent: Agent, seconds: float):
    """Adopt the recorded ranks and watch them for `seconds`; the adopted rank."""

    async def main():
        agent._wake = asyncio.Event()
        agent._adopt()
        local = agent.ranks[KEY]
        await asyncio.wait(local.tasks, timeout=seconds)
        for task in local.tasks:
            task.cancel()
        await asyncio.gather(*local.tasks, return_exceptions=True)
        return local

    return run_loop(main)


def test_a_recorded_shim_pid_that_names_another_process_is_an_exit(tmp_path: Path, stranger):
    """The record's shim started at another time (here: another boot) than the process its pid
    names now: the rank is reported lost at once, and the stranger is neither waited for nor
    signalled (without cgroups the agent would stop the rank by its process group)."""
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path, single_user=True)
    _record(agent, stranger.pid, "another-boot:12345")
    local = _adopt_and_watch(agent, 3.0)
    assert local.status is RankStatus.EXITED
    assert agent.outbox[(*KEY, "exited")]["exit_code"] == LOST_EXIT
    assert stranger.poll() is None
    agent._signal(local, 15)
    assert stranger.poll() is None


def test_a_recorded_shim_that_still_runs_is_re_adopted_running(tmp_path: Path, stranger):
    """The same process as recorded (pid and start): the rank runs on."""
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path, single_user=True)
    start = process_start(stranger.pid)
    assert start and start.count(":") == 1
    _record(agent, stranger.pid, start)
    local = _adopt_and_watch(agent, 0.5)
    assert local.status is RankStatus.RUNNING
    assert local.shim_pid == stranger.pid
    assert (*KEY, "exited") not in agent.outbox


def test_a_re_adopted_rank_ships_its_log_from_where_the_server_copy_ends_after_rotations(
    tmp_path: Path, stranger
):
    """A previous agent rotated the rank's log (14 bytes moved out); the new agent ships what the
    rank wrote since from offset 14, where the server's copy ends, not from 0."""
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path, single_user=True)
    _record(agent, stranger.pid, process_start(stranger.pid))
    (agent.state_dir / "job-7-gen-1-rank-3" / "log-rotated").write_text("14 10\n")
    (tmp_path / "rank.log").write_bytes(b"since\n")
    local = _adopt_and_watch(agent, 0.3)
    assert local.status is RankStatus.RUNNING
    agent.log_every_s = 0
    agent._logs_shipped([], {"logs": {"7:1:3": 14}})
    chunks = agent._log_chunks()
    assert [(c["offset"], c["data"]) for c in chunks] == [(14, "since\n")]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if int(_stat_fields(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


@pytest.mark.parametrize("tracking", ["cgroup", "process group"])
def test_a_rank_recorded_without_its_shim_before_it_joined_its_cgroup_is_re_adopted_running(
    tmp_path: Path, tracking
):
    """As an agent killed right after starting a rank's shim leaves it: the record names no shim,
    and the rank is not in its cgroup yet (the shim's child blocks opening a FIFO listed before
    the cgroup's procs files). The restarted agent finds the shim by the spec file it runs: the
    rank is running, not lost (a lost rank would start afterwards unwatched, on GPUs given to
    another job). Once the rank joined, a stop stops it and its exit comes from the shim."""
    cgroups = _required_cgroups(f"topoweb-unit-adopt-{os.getpid()}") if tracking == "cgroup" else None
    agent = make_agent(tmp_path, cgroups)
    prepare(agent)
    record = agent.state_dir / "job-7-gen-1-rank-3"
    record.mkdir()
    group = cgroups.create(record.name) if cgroups is not None else None
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    spec = {
        "argv": ["sleep", "60"],
        "workdir": str(tmp_path),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": None,
        "procs": [str(gate), *(group.procs_files() if group is not None else ())],
        "exit_file": str(record / "exit"),
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    }
    (record / "spec.json").write_text(json.dumps(spec))
    data = {
        "key": list(KEY),
        "plan": {"rank": 3, "local_rank": 0, "gpu": 0, "env": {}},
        "log_path": str(agent.log_dir / "rank.log"),
        "stop_grace_s": 5.0,
        "cgroup": None if group is None else {"version": group.version, "dirs": [str(d) for d in group.dirs]},
        "shim_pid": None,
        "shim_start": "",
    }
    (record / "rank.json").write_text(json.dumps(data))
    shim = subprocess.Popen(
        [sys.executable, "-I", str(SHIM), str(record / "spec.json")], start_new_session=True
    )
    # Reaped at once, as init reaps a dead agent's shim (a zombie leader keeps its group alive).
    reaper = threading.Thread(target=shim.wait, daemon=True)
    reaper.start()
    reader = None
    try:
        deadline = time.monotonic() + 10
        while not _children(shim.pid):
            assert time.monotonic() < deadline, "the shim did not fork the rank"
            time.sleep(0.02)

        async def main():
            nonlocal reader
            agent._adopt()
            local = agent.ranks[KEY]
            await asyncio.sleep(1.0)
            assert local.status is RankStatus.RUNNING, agent.outbox
            assert local.shim_pid == shim.pid
            assert json.loads((record / "rank.json").read_text())["shim_pid"] == shim.pid
            assert (*KEY, "exited") not in agent.outbox
            # The rank joins its cgroup and execs its command.
            reader = os.open(gate, os.O_RDONLY | os.O_NONBLOCK)
            deadline = time.monotonic() + 10
            while not any(Path(f"/proc/{p}/exe").resolve().name == "sleep" for p in _children(shim.pid)):
                assert time.monotonic() < deadline, "the rank did not start"
                await asyncio.sleep(0.02)
            if group is not None:
                assert group.pids()
            agent._begin_stop(local)
            return await wait_exited(agent, KEY)

        report = run_loop(main)
        assert report["exit_code"] == -15 and report["cause"] == "exited"
        reaper.join(timeout=10)
        assert shim.returncode == 128 + 15
    finally:
        if reader is not None:
            os.close(reader)
        cleanup(agent)
        # The shim's group: its child too, should it still wait to join the cgroup.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shim.pid, signal.SIGKILL)
        shim.wait()
        if group is not None:
            group.remove()

"""The agent's state directory: one agent per directory and per node on a host, records written
whole, an identity naming the server the records were made for, and ranks recorded without
their shim. The first sync reports nothing recorded until the server's answer names it."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from apps.agent.__main__ import main
from apps.agent.runner import (
    LOCKED_EXIT,
    Agent,
    LocalRank,
    StateDirBusy,
    write_atomic,
)

from .test_adopt import KEY, _record
from .test_stop import run_loop

SERVER = {"server_id": "5e7e1d01", "cluster": "c", "node": "n"}


def _agent(tmp_path: Path, **kw) -> Agent:
    return Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path, single_user=True, **kw)


def test_a_second_agent_on_the_state_directory_or_the_node_is_refused_naming_the_holder(tmp_path):
    first = _agent(tmp_path, lock_dir=tmp_path / "locks")
    first.lock_state_dir()
    same_dir = _agent(tmp_path, lock_dir=tmp_path / "other-locks")
    with pytest.raises(StateDirBusy, match=f"pid {os.getpid()}.*state directory"):
        same_dir.lock_state_dir()
    same_node = _agent(tmp_path, state_dir=tmp_path / "s2", lock_dir=tmp_path / "locks")
    with pytest.raises(StateDirBusy, match="node n on this host"):
        same_node.lock_state_dir()
    # The refused one released what it had taken: another directory and host lock are free.
    _agent(tmp_path, state_dir=tmp_path / "s2", lock_dir=tmp_path / "locks-3").lock_state_dir()


def test_the_agent_exits_75_when_its_state_directory_is_held(tmp_path, capsys):
    held = _agent(tmp_path, state_dir=tmp_path / "state")
    held.lock_state_dir()
    token = tmp_path / "token"
    token.write_text("tn_key\n")
    argv = ["--server", "http://topoweb", "--token-file", str(token), "--state-dir", str(tmp_path / "state")]
    argv += ["--lock-dir", str(tmp_path / "locks"), "--log-dir", str(tmp_path / "logs"), "--no-cgroups"]
    argv += ["--single-user"] + (["--allow-root"] if os.geteuid() == 0 else [])
    assert main(argv) == LOCKED_EXIT == 75
    assert f"pid {os.getpid()}" in capsys.readouterr().err


def test_a_restarted_agent_on_the_host_names_its_predecessor_even_without_its_state(tmp_path):
    """The host lock keeps the last instance: a successor whose state directory was lost names it."""
    code = (
        "from apps.agent.runner import Agent;"
        f"a = Agent(server='http://x', node='n', token='k', log_dir={str(tmp_path)!r},"
        f" state_dir={str(tmp_path / 'old')!r}, lock_dir={str(tmp_path / 'locks')!r});"
        "a.lock_state_dir(); print(a.instance)"
    )
    old = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd(), check=True
    )
    successor = _agent(tmp_path, state_dir=tmp_path / "new", lock_dir=tmp_path / "locks")
    successor.lock_state_dir()
    assert successor._previous() == old.stdout.strip()


def test_records_are_written_whole_and_private(tmp_path):
    path = tmp_path / "rank.json"
    write_atomic(path, '{"a": 1}')
    write_atomic(path, '{"a": 2}')
    assert json.loads(path.read_text()) == {"a": 2}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank.json"]


def _serve(answers: list[dict]):
    """An httpx transport answering each sync with the next answer; the bodies it got."""
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        answer = answers[min(len(bodies), len(answers)) - 1]
        return httpx.Response(answer.pop("status", 200), json=answer)

    return httpx.MockTransport(handler), bodies


def _sync_twice(agent: Agent, answers: list[dict]) -> list[dict]:
    transport, bodies = _serve(answers)

    async def main():
        agent._wake = asyncio.Event()
        agent.identity = agent._read_identity()
        agent._adopt()
        async with httpx.AsyncClient(base_url="http://topoweb", transport=transport) as client:
            await agent._sync(client)
            await agent._sync(client)
        for local in agent.ranks.values():
            for task in local.tasks:
                task.cancel()

    run_loop(main)
    return bodies


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_recorded_ranks_are_reported_only_after_the_server_confirmed_the_identity(tmp_path, sleeper):
    from apps.agent.runner import process_start

    agent = _agent(tmp_path)
    _record(agent, sleeper.pid, process_start(sleeper.pid))
    write_atomic(
        agent.state_dir / "identity.json", json.dumps({"server": "5e7e1d01", "cluster": "c", "node": "n"})
    )
    bodies = _sync_twice(agent, [{**SERVER, "work": []}, {**SERVER, "work": []}])
    assert bodies[0]["reports"] == [] and bodies[0]["wait_s"] == 0.0
    assert bodies[0]["instance"] == agent.instance and len(agent.instance) == 32
    assert [r["event"] for r in bodies[1]["reports"]] == ["started"]
    assert json.loads((agent.state_dir / "identity.json").read_text())["instance"] == agent.instance
    assert bodies[1]["previous"] == agent.instance


def test_records_of_another_server_are_disowned_and_never_reported(tmp_path, sleeper):
    from apps.agent.runner import process_start

    agent = _agent(tmp_path)
    _record(agent, sleeper.pid, process_start(sleeper.pid))
    write_atomic(
        agent.state_dir / "identity.json", json.dumps({"server": "0ther5e7", "cluster": "c", "node": "n"})
    )
    bodies = _sync_twice(agent, [{**SERVER, "work": []}, {**SERVER, "work": []}])
    assert KEY not in agent.ranks and agent.foreign[KEY] == "0ther5e7"
    # The first body counts it running (a node back from down must not look empty meanwhile);
    # no body reports it, and once disowned it is not counted as this server's.
    assert all(not b["reports"] for b in bodies) and bodies[1]["running"] == []
    assert not (agent.state_dir / "job-7-gen-1-rank-3").exists()
    assert json.loads((agent.state_dir / "identity.json").read_text())["server"] == "5e7e1d01"
    # Without a cgroup to stop it by, its process group got SIGTERM.
    assert sleeper.wait(timeout=5) == -15


def test_an_unreadable_identity_adopts_nothing(tmp_path, sleeper):
    from apps.agent.runner import process_start

    agent = _agent(tmp_path)
    _record(agent, sleeper.pid, process_start(sleeper.pid))
    (agent.state_dir / "identity.json").write_text("{not json")
    _sync_twice(agent, [{**SERVER, "work": []}, {**SERVER, "work": []}])
    assert KEY not in agent.ranks and agent.foreign[KEY] == "unknown"


def test_a_refused_agent_starts_nothing_and_logs_once(tmp_path, caplog, monkeypatch):
    from apps.agent import runner

    monkeypatch.setattr(runner, "RETRY_S", (0.01,))
    agent = _agent(tmp_path)
    refusal = {"status": 409, "detail": "node 'n' has a live agent already: instance ab on h2"}
    bodies = _sync_twice(agent, [dict(refusal), dict(refusal)])
    assert len(bodies) == 2 and agent.state == "refused" and not agent.confirmed
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "has a live agent already" in errors[0].getMessage()
    assert not (agent.state_dir / "identity.json").exists()


class FakeGroup:
    """A rank cgroup holding `proc` while it runs."""

    version = 2

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def pids(self) -> set[int]:
        return {self.proc.pid} if self.proc.poll() is None else set()

    def empty(self) -> bool:
        return not self.pids()


def test_a_rank_recorded_without_its_shim_runs_while_its_cgroup_holds_it(tmp_path, sleeper):
    agent = _agent(tmp_path)
    record = tmp_path / "rec"
    record.mkdir()
    from apps.agent.env import RankPlan

    local = LocalRank(KEY, RankPlan(3, 0, 0, {}), tmp_path / "log", 1.0, record, cgroup=FakeGroup(sleeper))
    assert agent._main_exit(local) is None
    sleeper.kill()
    sleeper.wait()
    # Gone without an exit file: unknown.
    assert agent._main_exit(local) == 255
    (record / "exit").write_text('{"exit_code": 0}')
    assert agent._main_exit(local) == 0


def test_no_rank_starts_while_orphans_remain_and_an_orphan_is_not_reported_lost(tmp_path):
    agent = _agent(tmp_path)
    entry = {
        "job": 9,
        "generation": 1,
        "command": ["true"],
        "env": {},
        "world_size": 2,
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "node_rank": 0,
        "ranks": [{"rank": 0, "gpu": 0, "started": True}, {"rank": 1, "gpu": 1}],
    }

    async def main():
        agent._wake = asyncio.Event()
        agent.orphans[(9, 1, 0)] = asyncio.get_running_loop().create_future()
        await agent._reconcile([entry])

    run_loop(main)
    # Rank 0 runs as an orphan (not reported lost), rank 1 waits for the orphan to be gone.
    assert agent.ranks == {} and agent.outbox == {}


def test_a_server_that_answers_as_another_later_has_the_ranks_of_the_one_before_disowned(tmp_path, sleeper):
    """The database behind the server was replaced while the agent ran: its ranks are the old
    server's, stopped and never reported to the new one again."""
    from apps.agent.runner import process_start

    agent = _agent(tmp_path)
    _record(agent, sleeper.pid, process_start(sleeper.pid))
    write_atomic(
        agent.state_dir / "identity.json", json.dumps({"server": "5e7e1d01", "cluster": "c", "node": "n"})
    )
    _sync_twice(agent, [{**SERVER, "work": []}, {**SERVER, "server_id": "0new0001", "work": []}])
    assert KEY not in agent.ranks and agent.foreign[KEY] == "5e7e1d01"
    assert not any(k[:3] == KEY for k in agent.outbox)
    assert json.loads((agent.state_dir / "identity.json").read_text())["server"] == "0new0001"
    assert sleeper.wait(timeout=5) == -15

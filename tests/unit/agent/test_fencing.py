"""The agent's lease: when it fences, counted from its last answered sync, and what a restarted
agent does with an old lease (tries the server first, fences no later than the server allows)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from apps.agent import runner
from apps.agent.env import RankPlan
from apps.agent.runner import Agent, LocalRank, RankStatus

from .test_stop import run_loop


class Clock:
    """Wall and monotonic time the test moves."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 5_000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(runner, "time", c)
    return c


def restarted(tmp_path: Path, clock: Clock, *, silent_s: float, fence: float = 50.0, slack: float = 30.0):
    """An agent started now whose lease.json says its last answered sync left `silent_s` ago,
    running one re-adopted rank; returns it and the list its stops go to."""
    state = tmp_path / ".state"
    state.mkdir(exist_ok=True)
    (state / "lease.json").write_text(
        json.dumps({"contact": clock.wall - silent_s, "fence_after_s": fence, "fence_slack_s": slack})
    )
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path)
    key = (1, 1, 0)
    agent.ranks[key] = LocalRank(
        key, RankPlan(rank=0, local_rank=0, gpu=0, env={}), tmp_path / "r.log", 30.0, tmp_path
    )
    stopped: list = []
    agent._begin_stop = stopped.append
    agent._last_ok = clock.monotonic()
    agent._load_lease()
    return agent, stopped


def fenced_at(agent: Agent, stopped: list, clock: Clock, until_s: float) -> float | None:
    """Seconds after the start at which the agent fenced (checking every 0.25 s), or None."""
    start = clock.mono
    while clock.mono - start <= until_s:
        agent._check_fence()
        if stopped:
            return clock.mono - start
        clock.advance(0.25)
    return None


def test_a_restart_after_more_than_the_lease_tries_the_server_before_fencing(tmp_path, clock):
    # Silent 60 s with a 50 s lease and 30 s of slack: min(start + 30, contact + 80) = start + 20.
    agent, stopped = restarted(tmp_path, clock, silent_s=60.0)
    agent._check_fence()
    assert stopped == []
    assert fenced_at(agent, stopped, clock, 40.0) == pytest.approx(20.0, abs=0.3)
    assert agent.ranks[(1, 1, 0)].note.startswith("fenced")


def test_a_restart_soon_after_the_last_contact_keeps_the_whole_lease(tmp_path, clock):
    # Silent 10 s: max(contact + 50, min(start + 30, contact + 80)) = start + 40.
    agent, stopped = restarted(tmp_path, clock, silent_s=10.0)
    assert fenced_at(agent, stopped, clock, 60.0) == pytest.approx(40.0, abs=0.3)


def test_a_restart_between_lease_and_lease_plus_slack_gets_the_slack_at_most(tmp_path, clock):
    # Silent 45 s: max(contact + 50, min(start + 30, contact + 80)) = start + 30.
    agent, stopped = restarted(tmp_path, clock, silent_s=45.0)
    assert fenced_at(agent, stopped, clock, 60.0) == pytest.approx(30.0, abs=0.3)


def test_a_restart_past_lease_plus_slack_fences_at_once(tmp_path, clock):
    """The server's fence deadline may be near: the agent cannot wait for an answer."""
    agent, stopped = restarted(tmp_path, clock, silent_s=81.0)
    assert fenced_at(agent, stopped, clock, 1.0) == 0.0


def test_a_lease_without_slack_fences_on_the_lease_alone(tmp_path, clock):
    agent, stopped = restarted(tmp_path, clock, silent_s=60.0, slack=0.0)
    assert fenced_at(agent, stopped, clock, 1.0) == 0.0


def test_an_answered_sync_renews_the_lease_and_records_the_servers_slack(tmp_path, clock):
    agent, stopped = restarted(tmp_path, clock, silent_s=60.0)
    answers = []

    def handler(request: httpx.Request) -> httpx.Response:
        answers.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={
                "state": "up",
                "fence_after_s": 70.0,
                "fence_slack_s": 20.0,
                "work": [],
                "stop": [],
            },
        )

    async def one_sync() -> None:
        agent._wake = asyncio.Event()
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(base_url="http://topoweb", transport=transport) as client:
            await agent._sync(client)

    clock.advance(10.0)
    run_loop(one_sync)
    assert answers and answers[0]["running"] == [[1, 1, 0]]
    lease = json.loads((agent.state_dir / "lease.json").read_text())
    assert lease == {"contact": clock.wall, "fence_after_s": 70.0, "fence_slack_s": 20.0}
    # The work no longer lists the rank: reconcile stops it (not a fence).
    assert stopped == [agent.ranks[(1, 1, 0)]] and agent.fenced == 0
    stopped.clear()
    agent.ranks[(1, 1, 0)].status = RankStatus.RUNNING
    # The lease now runs from this answered sync: 70 s.
    assert fenced_at(agent, stopped, clock, 80.0) == pytest.approx(70.0, abs=0.3)


def test_failed_syncs_do_not_renew_the_lease(tmp_path, clock):
    agent, stopped = restarted(tmp_path, clock, silent_s=60.0)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="down for maintenance")

    async def one_sync() -> None:
        agent._wake = asyncio.Event()
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(base_url="http://topoweb", transport=transport) as client:
            with pytest.raises(ValueError):
                await agent._sync(client)

    run_loop(one_sync)
    assert fenced_at(agent, stopped, clock, 40.0) == pytest.approx(20.0, abs=0.3)

"""A revoked node token: the agent says so once and retries ever more slowly (never a warning
every few seconds for ever); an accepted sync afterwards says the credential works again."""

from __future__ import annotations

import logging

import httpx

from apps.agent import runner
from apps.agent.runner import CREDENTIAL_RETRY_MAX_S, RETRY_S, Agent

from .test_stop import run_loop


def test_a_refused_credential_is_logged_once_and_retried_ever_more_slowly(tmp_path, monkeypatch, caplog):
    agent = Agent(
        server="http://topoweb", node="n", token="k", log_dir=tmp_path / "logs", state_dir=tmp_path / "state"
    )
    answers = {"status": 401}

    def handler(request: httpx.Request) -> httpx.Response:
        if answers["status"] == 401:
            return httpx.Response(401, json={"detail": "Invalid token."})
        return httpx.Response(200, json={"state": "up", "work": [], "stop": []})

    real = httpx.AsyncClient
    monkeypatch.setattr(
        runner.httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    delays: list[float] = []

    async def pause(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) == 9:
            answers["status"] = 200  # the token is valid again (a new one was installed)
            agent.poll_s = 0.0

    monkeypatch.setattr(agent, "_pause", pause)
    synced = agent.syncs

    async def main():
        original = agent._sync

        async def sync(client):
            await original(client)
            if agent.syncs > synced:
                agent.stop()

        monkeypatch.setattr(agent, "_sync", sync)
        await agent.run()

    with caplog.at_level(logging.INFO, logger="topoweb.agent"):
        run_loop(main)
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("refuses this agent's node token" in m for m in messages) == 1
    assert not any("sync with" in m for m in messages)
    assert delays == [min(RETRY_S[-1] * 2**i, CREDENTIAL_RETRY_MAX_S) for i in range(9)]
    assert delays[-1] == CREDENTIAL_RETRY_MAX_S
    assert any("accepts this agent's credential again" in m for m in messages)

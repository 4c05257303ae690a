"""The agent's command line: the protocol's default interval and its bounds."""

from __future__ import annotations

import pytest

from apps.agent.__main__ import main, parse_args
from apps.agent.runner import DEFAULT_POLL_S, Agent


def test_the_agent_polls_once_a_minute_by_default(tmp_path):
    args = parse_args(["--server", "http://topoweb", "--token-file", "t"])
    assert args.poll_s == DEFAULT_POLL_S == 60.0
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path)
    assert agent.poll_s == 60.0


@pytest.mark.parametrize("poll", ["0", "61", "-5"])
def test_a_poll_outside_the_protocols_bounds_exits_2(tmp_path, capsys, poll):
    token = tmp_path / "token"
    token.write_text("launcher-key\n")
    code = main(["--server", "http://topoweb", "--token-file", str(token), "--poll-s", poll])
    assert code == 2
    assert "--poll-s" in capsys.readouterr().err

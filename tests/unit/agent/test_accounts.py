"""Ranks run as people's accounts: the agent refuses root and system accounts (uid below
UID_MIN) unless told a service account may run ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.agent.accounts import DEFAULT_UID_MIN, system_account_refusal, uid_min
from apps.agent.runner import Agent, StartRefused


def test_uid_min_comes_from_login_defs_or_defaults_to_1000(tmp_path: Path):
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t\t 5000\nUID_MAX 60000\n")
    assert uid_min(defs) == 5000
    defs.write_text("UID_MIN garbage\n")
    assert uid_min(defs) == DEFAULT_UID_MIN
    assert uid_min(tmp_path / "missing") == DEFAULT_UID_MIN


def test_the_refusal_names_the_account_its_uid_and_the_minimum():
    assert system_account_refusal("alice", 1001, 1000) == ""
    assert "is root" in system_account_refusal("root", 0, 1000)
    assert system_account_refusal("mysql", 107, 1000) == (
        "Unix account 'mysql' is a system account (uid 107, below UID_MIN 1000): ranks run as people's accounts"
    )


def agent(tmp_path: Path, **kwargs) -> Agent:
    return Agent(server="http://topoweb", node="n1", token="k", log_dir=tmp_path, allow_root=True, **kwargs)


def test_a_job_mapped_to_a_system_account_is_refused_at_start(tmp_path: Path):
    # daemon (uid 1) exists on every Debian host.
    with pytest.raises(
        StartRefused, match=r"'daemon' is a system account \(uid 1, below UID_MIN 1000\).*node n1"
    ):
        agent(tmp_path, min_uid=1000)._account({"account": "daemon"})
    allowed = agent(tmp_path, min_uid=1000, system_accounts=("daemon",))._account({"account": "daemon"})
    assert allowed.uid == 1
    # The minimum is the node's: with none set, login.defs decides.
    assert agent(tmp_path).min_uid == uid_min()


def test_single_user_mode_runs_as_the_agents_own_user_whatever_its_uid(tmp_path: Path):
    account = agent(tmp_path, single_user=True, min_uid=10**6)._account({"account": "daemon"})
    assert account.name != "daemon"

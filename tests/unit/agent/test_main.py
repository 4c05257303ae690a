"""The agent's command line: the protocol's default interval and its bounds."""

from __future__ import annotations

import os
import stat

import pytest

from apps.agent.__main__ import main, parse_args
from apps.agent.cgroups import CgroupError, detect, gpu_devices
from apps.agent.runner import DEFAULT_POLL_S, Agent, run_in_thread


def test_the_agent_polls_once_a_minute_by_default(tmp_path):
    args = parse_args(["--server", "http://topoweb", "--token-file", "t"])
    assert args.poll_s == DEFAULT_POLL_S == 60.0
    agent = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path)
    assert agent.poll_s == 60.0


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--poll-s", "0"),
        ("--poll-s", "61"),
        ("--poll-s", "-5"),
        ("--pids-max", "-1"),
        ("--pids-max", "4194305"),
        ("--memory-max-mb", "-1"),
        ("--memory-max-mb", "4194305"),
    ],
)
def test_a_setting_outside_its_bounds_exits_2_naming_it(tmp_path, capsys, flag, value):
    token = tmp_path / "token"
    token.write_text("launcher-key\n")
    code = main(["--server", "http://topoweb", "--token-file", str(token), flag, value])
    assert code == 2
    assert flag in capsys.readouterr().err


def _token(tmp_path):
    token = tmp_path / "token"
    token.write_text("tn_key\n")
    return str(token)


@pytest.mark.skipif(os.geteuid() != 0, reason="the root checks")
def test_single_user_as_root_needs_allow_root(tmp_path, capsys):
    code = main(["--server", "http://topoweb", "--token-file", _token(tmp_path), "--single-user"])
    assert code == 2 and "--allow-root" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="run as a user without root")
def test_without_root_the_agent_needs_single_user(tmp_path, capsys):
    code = main(["--server", "http://topoweb", "--token-file", _token(tmp_path)])
    assert code == 2 and "--single-user" in capsys.readouterr().err


def test_without_a_cgroup_hierarchy_auto_finds_none_and_a_named_one_is_an_error(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n")
    assert detect("auto", "topoweb-n", mounts=mounts) is None
    for mode in ("v1", "v2"):
        with pytest.raises(CgroupError, match=mode):
            detect(mode, "topoweb-n", mounts=mounts)
    with pytest.raises(CgroupError, match="--cgroups"):
        detect("v3", "topoweb-n", mounts=mounts)
    with pytest.raises(CgroupError, match="--cgroup-name"):
        detect("auto", "../escape", mounts=mounts)


def test_gpu_device_files_are_found_by_name_and_kind(tmp_path):
    (tmp_path / "nvidia0").write_text("not a device")
    (tmp_path / "nvidiactl").write_text("")
    assert gpu_devices(tmp_path) == {}
    if os.geteuid() == 0:
        os.mknod(tmp_path / "nvidia3", 0o600 | stat.S_IFCHR, os.makedev(195, 3))
        assert gpu_devices(tmp_path) == {3: (195, 3)}


def test_an_agent_restarted_while_cut_off_keeps_counting_its_lease_from_the_last_contact(tmp_path):
    import time

    first = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path)
    first.state_dir.mkdir(parents=True)
    first.fence_after_s = 50.0
    first._save_lease(time.time() - 100)
    again = Agent(server="http://topoweb", node="n", token="k", log_dir=tmp_path)
    again._last_ok = time.monotonic()
    again._load_lease()
    assert again.fence_after_s == 50.0
    # From the contact 100 s ago, not from now (the upper bound leaves a loaded machine room).
    assert 99 < time.monotonic() - again._last_ok < 130


def test_a_failed_sync_without_a_message_is_logged_by_its_kind(tmp_path, caplog):
    """A dropped connection or a timeout often carries no message: the log names the error. The
    first failure in a row is information (a busy server may drop one connection), the second a
    warning."""
    import logging

    import httpx

    agent = Agent(server="http://127.0.0.1:9", node="n", token="k", log_dir=tmp_path)
    calls = []

    async def sync(client):
        calls.append(1)
        if len(calls) == 2:
            agent._stopping.set()
        raise httpx.ReadError("")

    async def nothing(*args):
        return None

    agent._sync, agent._pause, agent._shutdown = sync, nothing, nothing
    with caplog.at_level(logging.INFO, logger="topoweb.agent"):
        # In a thread of its own, as the demo runs agents: the suite may hold an event loop here.
        thread = run_in_thread(agent)
        thread.join(10)
    assert not thread.is_alive()
    failed = [
        r for r in caplog.records if "sync with http://127.0.0.1:9 failed (ReadError); retrying" in r.message
    ]
    assert [r.levelno for r in failed] == [logging.INFO, logging.WARNING]

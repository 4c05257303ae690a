"""The Unix account each user's ranks run as, and the demo's single-user agents refused in a
production configuration."""

from __future__ import annotations

import io

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from apps.scheduling.models import UnixAccount


def run(*args) -> str:
    out = io.StringIO()
    call_command("unix_account", *args, stdout=out)
    return out.getvalue().strip()


def test_the_account_is_the_username_until_an_admin_sets_another(alice):
    assert run("alice") == "alice runs as alice"
    assert run("alice", "alice_hpc") == "alice runs as alice_hpc"
    assert UnixAccount.objects.get(user=alice).name == "alice_hpc"
    assert run("alice", "--reset") == "alice runs as alice"
    assert not UnixAccount.objects.filter(user=alice).exists()


@pytest.mark.parametrize("name", ["Root Admin", "../x", "a" * 40, "0day;rm"])
def test_a_bad_account_name_or_user_is_refused(alice, name):
    with pytest.raises(CommandError, match="NAME"):
        run("alice", name)
    with pytest.raises(CommandError, match="unknown user"):
        run("nobody", "x")


def test_the_demo_agents_are_refused_in_a_production_configuration(db):
    from apps.executors.agents.demo import start_demo_agents

    with (
        override_settings(EMBEDDED=False, TESTING=False),
        pytest.raises(ImproperlyConfigured, match="single-user"),
    ):
        start_demo_agents(server="http://127.0.0.1:1")


def test_root_and_system_accounts_are_refused_at_mapping_time_unless_named_a_service_account(alice):
    with pytest.raises(CommandError, match=r"NAME: Unix account 'root' is root \(uid 0\)"):
        run("alice", "root")
    with pytest.raises(CommandError, match="root"):
        run("alice", "root", "--system-account")
    # daemon (uid 1 on every Debian host) is the system's: refused, unless mapped on purpose.
    with pytest.raises(
        CommandError, match=r"'daemon' is a system account \(uid 1, below UID_MIN .*--system-account"
    ):
        run("alice", "daemon")
    assert not UnixAccount.objects.filter(user=alice).exists()
    assert run("alice", "daemon", "--system-account") == "alice runs as daemon"

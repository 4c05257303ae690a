"""The Postgres backend's socket check (`topoweb.postgres.base.server_spoke`) on plain sockets:
a quiet connection has nothing to read, one the other end wrote to or closed has, at any
descriptor number (a web process with thousands of agents' long-polls has them above 1024)."""

from __future__ import annotations

import os
import resource
import socket
from types import SimpleNamespace

import pytest

from topoweb.postgres.base import server_spoke


def driver(sock: socket.socket, fd: int | None = None) -> SimpleNamespace:
    """What the check reads of psycopg's connection."""
    return SimpleNamespace(closed=False, broken=False, fileno=lambda: sock.fileno() if fd is None else fd)


@pytest.fixture
def pair():
    ours, server = socket.socketpair()
    yield ours, server
    ours.close()
    server.close()


def test_a_quiet_connection_has_not_spoken_and_an_ended_one_has(pair):
    ours, server = pair
    assert server_spoke(driver(ours)) is False
    server.close()
    assert server_spoke(driver(ours)) is True


def test_a_broken_or_closed_driver_connection_has_spoken(pair):
    ours, _ = pair
    assert server_spoke(SimpleNamespace(closed=True, broken=False, fileno=ours.fileno)) is True
    assert server_spoke(SimpleNamespace(closed=False, broken=True, fileno=ours.fileno)) is True


def test_a_descriptor_above_1024_is_checked_not_taken_for_broken(pair):
    ours, server = pair
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 2000:
        pytest.skip(f"the descriptor limit ({soft}) leaves no room above 1024")
    high = os.dup2(ours.fileno(), 2000)
    try:
        assert server_spoke(driver(ours, high)) is False
        server.sendall(b"E")
        assert server_spoke(driver(ours, high)) is True
    finally:
        os.close(high)

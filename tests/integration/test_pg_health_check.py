"""The Postgres backend's health check: no round trip on a quiet healthy connection, and a
connection the server has ended is found and replaced before the request's first query."""

from __future__ import annotations

import time

import pytest
from django.db import connection, connections
from django.db.backends.postgresql import base as django_postgres

from tests.writeslots import slot_free
from topoweb.postgres.base import DatabaseWrapper, server_spoke

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]


@pytest.fixture
def own(transactional_db):
    """A second connection to the test database, with health checks on, as a web thread has."""
    wrapper = connections.create_connection("default")
    wrapper.health_check_enabled = True
    wrapper.ensure_connection()
    yield wrapper
    wrapper.close()


@pytest.fixture
def usable_calls(monkeypatch):
    """Counts the SELECT 1 health checks (Django's is_usable)."""
    calls: list[bool] = []
    original = django_postgres.DatabaseWrapper.is_usable

    def counted(self):
        calls.append(True)
        return original(self)

    monkeypatch.setattr(django_postgres.DatabaseWrapper, "is_usable", counted)
    return calls


def backend_pid(wrapper) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_the_settings_use_this_backend_on_postgres():
    assert isinstance(connections["default"], DatabaseWrapper)


def test_a_quiet_healthy_connection_is_reused_without_a_select_1(own, usable_calls):
    pid = backend_pid(own)
    for _ in range(3):
        own.close_if_unusable_or_obsolete()  # a request's end
        own.close_if_health_check_failed()  # the next request's first query
        assert backend_pid(own) == pid
    assert usable_calls == []


def test_a_connection_the_server_ended_is_replaced_before_the_first_query(own, usable_calls):
    pid = backend_pid(own)
    own.close_if_unusable_or_obsolete()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 10
    while not server_spoke(own.connection):
        assert time.monotonic() < deadline, "the ended connection never became readable"
        time.sleep(0.02)
    own.close_if_health_check_failed()
    assert usable_calls == [True]
    # No error reaches the request: its first query runs on a new connection.
    assert backend_pid(own) != pid


def test_a_commit_lends_the_write_slot_its_thread_holds(own, monkeypatch):
    """While the server flushes a COMMIT the thread's API write slot is free for the next write,
    and held again once the COMMIT returns."""
    import threading

    from apps.api.writeslots import holding

    slot = threading.BoundedSemaphore(1)
    free_during: list[bool] = []
    original = django_postgres.DatabaseWrapper._commit

    def commit(self):
        free_during.append(slot_free(slot))
        return original(self)

    monkeypatch.setattr(django_postgres.DatabaseWrapper, "_commit", commit)
    slot.acquire()
    holding(slot)
    try:
        own.set_autocommit(False)
        with own.cursor() as cursor:
            cursor.execute("SELECT 1")
        own.commit()
        own.set_autocommit(True)
        assert not slot.acquire(blocking=False)  # held again
    finally:
        holding(None)
        slot.release()
    assert free_during == [True]

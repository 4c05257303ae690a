"""The hot statements of the control plane run as prepared statements on Postgres.

Django binds parameters on the client and disables psycopg's prepared statements, so the server
parses and plans every statement it is sent. For the node agents' sync that planning is most of
the database's work: the node's work (a UNION with a correlated subquery) plans in about 1.3 ms
and runs in 0.1 ms, and 2,048 agents sync 34 times a second. `fetch_all` sends statements with
server-side binding, prepared on the connection the first time each is sent (psycopg keeps the
names, per connection), and several of them in one round trip (a pipeline). Everything else stays
as Django runs it.

A pooler that hands one client's statements to other server connections (PgBouncer before 1.21
in transaction mode) does not keep prepared statements: `TOPOWEB_DB_PREPARED=false` sends these
statements as Django would (settings `DB_PREPARED_STATEMENTS`). SQLite runs them one by one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

Statement = tuple[str, Sequence[Any]]


def prepared() -> bool:
    """Whether statements run prepared here (Postgres, and not turned off)."""
    return connection.vendor == "postgresql" and getattr(settings, "DB_PREPARED_STATEMENTS", False)


def fetch_all(statements: Sequence[Statement]) -> list[list[tuple]]:
    """The rows of each statement (`%s` placeholders), in one round trip on Postgres: prepared
    (see the module), else in one message with the parameters bound by the client. On SQLite one
    after the other."""
    if prepared():
        return _run_prepared(statements, fetch=True)
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql" or len(statements) == 1:
            results = []
            for sql, params in statements:
                cursor.execute(sql, params)
                results.append(cursor.fetchall())
            return results
        cursor.execute(
            "; ".join(sql for sql, _ in statements), [p for _, params in statements for p in params]
        )
        results = [cursor.fetchall()]
        while cursor.nextset():
            results.append(cursor.fetchall())
    return results


def execute(sql: str, params: Sequence[Any]) -> int:
    """Run one statement that returns no rows (prepared where `fetch_all`'s are); its row count."""
    if prepared():
        return _run_prepared([(sql, params)], fetch=False)[0]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _run_prepared(statements: Sequence[Statement], *, fetch: bool) -> list:
    # What Django's cursor does around a statement: a connection (opened if needed), no statement
    # in a transaction already broken, the driver's errors as Django's, and the query log.
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    started = time.monotonic()
    with connection.wrap_database_errors:
        cursors = [psycopg.Cursor(raw) for _ in statements]
        try:
            if len(statements) == 1:
                cursors[0].execute(statements[0][0], statements[0][1], prepare=True)
            else:
                with raw.pipeline():
                    for cursor, (sql, params) in zip(cursors, statements, strict=True):
                        cursor.execute(sql, params, prepare=True)
            results = [cursor.fetchall() if fetch else cursor.rowcount for cursor in cursors]
        finally:
            for cursor in cursors:
                cursor.close()
    if connection.queries_logged:
        # One entry per round trip, as Django logs a message of several statements.
        connection.queries_log.append(
            {"sql": "; ".join(sql for sql, _ in statements), "time": f"{time.monotonic() - started:.3f}"}
        )
    return results

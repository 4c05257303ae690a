"""Retry a database write that lost a race for SQLite's single write lock.

The embedded default (SQLite) lets one writer at a time hold the database; the others wait up to
the busy timeout and then fail with "database is locked". Under CPU load that happens to agent
syncs, metrics passes and scheduling ticks that all write at once. `retry_when_locked` runs such
a write again a few times, backing off, instead of failing the request or the pass. It is used
only around writes that are safe to repeat (upserts, heartbeats, reports that are idempotent)
and never inside an outer transaction, whose work the failure has already undone.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, connection

log = logging.getLogger(__name__)

T = TypeVar("T")

ATTEMPTS = 5
FIRST_DELAY_S = 0.05


def is_lock_error(exc: BaseException) -> bool:
    """True for SQLite's "database is locked" / "database table is locked" errors."""
    return isinstance(exc, OperationalError) and "is locked" in str(exc)


def retry_when_locked(
    fn: Callable[[], T],
    *,
    attempts: int = ATTEMPTS,
    first_delay_s: float = FIRST_DELAY_S,
    sleep: Callable[[float], None] = time.sleep,
    what: str = "write",
) -> T:
    """Call `fn`; when it fails because the database is locked, wait (doubling from
    `first_delay_s`, with jitter) and call it again, at most `attempts` calls in all. Any other
    error, the last attempt's error, and a lock error inside an outer atomic block propagate."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except OperationalError as exc:
            if not is_lock_error(exc) or attempt == attempts or connection.in_atomic_block:
                raise
            delay = first_delay_s * 2 ** (attempt - 1) * (1 + random.random())
            log.info(
                "%s: database locked (attempt %d of %d), retrying in %.2f s", what, attempt, attempts, delay
            )
            sleep(delay)
    raise AssertionError("unreachable")

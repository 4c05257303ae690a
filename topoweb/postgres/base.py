"""Django's PostgreSQL backend with a health check that costs no round trip while the server is
quiet (ENGINE "topoweb.postgres", set by the settings for every Postgres DATABASE_URL).

Django checks a persistent connection before each request's first query with a SELECT 1: a round
trip per request, a tenth of an API submission's time. A connection the server has ended (a
restart, a failover, a terminated backend) always has something to read: the server's goodbye or
the end of the stream. So the socket is polled first, and only a connection with something to
read, or one the driver already knows is broken, gets the SELECT 1 (and is replaced if it
fails). An idle healthy connection has nothing to read. What neither check can see in time, a
network path that died silently, fails the request with a 503 (DatabaseUnavailableMiddleware)
and the connection is replaced at its end.

A COMMIT lends the API write slot its thread holds (`apps.api.writeslots.slot_lent`) while it
waits for the server's flush to disk.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base

from apps.api.writeslots import slot_lent


def server_spoke(connection) -> bool:
    """True when the driver's connection is closed or broken, or its socket has something to read
    (between requests a healthy connection has not)."""
    if connection.closed or connection.broken:
        return True
    # poll, not select: a web process holding thousands of agents' long-polls has descriptors
    # beyond select's 1024, where select refuses and every request would pay the SELECT 1.
    poller = select.poll()
    try:
        poller.register(connection.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


class DatabaseWrapper(base.DatabaseWrapper):
    def _commit(self):
        # Waiting for the server to flush the COMMIT runs no Python: an API write's slot
        # (topoweb.middleware) goes to the process's next write meanwhile, and is taken back after.
        with slot_lent():
            return super()._commit()

    def close_if_health_check_failed(self):
        if (
            self.connection is not None
            and self.health_check_enabled
            and not self.health_check_done
            and not self.pool
            and not server_spoke(self.connection)
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()

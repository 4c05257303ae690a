"""Wake agents' long-polls in this process when their cluster's work may have changed.

A web process that also runs the scheduling cycles (the embedded default) answers a waiting
agent as soon as a job is placed or stopped; where cycles run in a worker process the poll
simply ends at its timeout, and the agent asks again.
"""

from __future__ import annotations

import threading

from django.db import transaction

_COND = threading.Condition()
_EPOCH: dict[int, int] = {}


def epoch(cluster_id: int) -> int:
    """The cluster's change counter in this process."""
    with _COND:
        return _EPOCH.get(cluster_id, 0)


def _bump(cluster_id: int) -> None:
    with _COND:
        _EPOCH[cluster_id] = _EPOCH.get(cluster_id, 0) + 1
        _COND.notify_all()


def notify_cluster(cluster_id: int) -> None:
    """Wake this process's long-polls on the cluster once the current transaction commits."""
    transaction.on_commit(lambda: _bump(cluster_id), robust=True)


def wait_for_change(cluster_id: int, since: int, timeout_s: float) -> bool:
    """Block until the cluster's counter moves past `since` or `timeout_s` passes; True if it moved."""
    with _COND:
        return _COND.wait_for(lambda: _EPOCH.get(cluster_id, 0) != since, timeout=timeout_s)

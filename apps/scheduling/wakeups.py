"""Wake agents' long-polls in this process when their node's work may have changed.

A web process that also runs the scheduling cycles (the embedded default) answers a waiting
agent as soon as a job is placed on its node or stopped there; where cycles run in a worker
process the poll simply ends at its timeout and the agent asks again. Wakeups are per node, so
placing one job does not wake every agent of a large cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from django.db import transaction

_COND = threading.Condition()
# (cluster id, node name) -> change counter; node None counts changes to every node.
_EPOCH: dict[tuple[int, str | None], int] = {}


def epoch(cluster_id: int, node: str) -> tuple[int, int]:
    """The change counters (whole cluster, this node) in this process."""
    with _COND:
        return _EPOCH.get((cluster_id, None), 0), _EPOCH.get((cluster_id, node), 0)


def _bump(cluster_id: int, nodes: tuple[str, ...] | None) -> None:
    with _COND:
        for node in nodes if nodes is not None else (None,):
            _EPOCH[(cluster_id, node)] = _EPOCH.get((cluster_id, node), 0) + 1
        _COND.notify_all()


def notify_cluster(cluster_id: int, nodes: Iterable[str] | None = None) -> None:
    """Wake this process's long-polls of `nodes` (all of the cluster's when None) once the
    current transaction commits."""
    names = None if nodes is None else tuple(sorted(set(nodes)))
    transaction.on_commit(lambda: _bump(cluster_id, names), robust=True)


def wait_for_change(cluster_id: int, node: str, since: tuple[int, int], timeout_s: float) -> bool:
    """Block until the node's or the cluster's counter moves past `since` or `timeout_s` passes;
    True if it moved."""
    with _COND:
        return _COND.wait_for(lambda: epoch_unlocked(cluster_id, node) != since, timeout=timeout_s)


def epoch_unlocked(cluster_id: int, node: str) -> tuple[int, int]:
    return _EPOCH.get((cluster_id, None), 0), _EPOCH.get((cluster_id, node), 0)

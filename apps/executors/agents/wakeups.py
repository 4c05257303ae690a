"""Wake agents' long-polls when their node's work may have changed.

A web process that also runs the scheduling cycles (the embedded default) answers a waiting
agent as soon as a job is placed on its node or stopped there. Where cycles run in other
processes (Celery workers) and Redis is configured (CACHE_URL, else CELERY_BROKER_URL), every
change is also published on a Redis channel that each web process with waiting polls listens
to; without Redis, or while it is unreachable, a poll simply ends at its timeout and the agent
asks again. Wakeups are per node, so placing one job does not wake every agent of a large
cluster.

A poll waits in a thread (`wait_for_change`, the threaded servers) or as a future of an event
loop (`changed`, the ASGI path of topoweb/agents_asgi.py): both are woken by the same counters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Iterable

from django.conf import settings
from django.db import connection, transaction

log = logging.getLogger(__name__)
# This process's messages come back from Redis too: they are already applied.
_ORIGIN = f"{os.getpid()}-{id(log)}"
_LISTENER: threading.Thread | None = None
_LISTENER_LOCK = threading.Lock()
_PUBLISHERS: dict = {}

_COND = threading.Condition()
# (cluster id, node name) -> change counter; node None counts changes to every node.
_EPOCH: dict[tuple[int, str | None], int] = {}
# (cluster id, node name or None) -> the futures of polls waiting in an event loop.
_WAITERS: dict[tuple[int, str | None], set[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}


def epoch(cluster_id: int, node: str) -> tuple[int, int]:
    """The change counters (whole cluster, this node) in this process."""
    with _COND:
        return _EPOCH.get((cluster_id, None), 0), _EPOCH.get((cluster_id, node), 0)


def _bump(cluster_id: int, nodes: tuple[str, ...] | None) -> None:
    with _COND:
        woken = []
        for node in nodes if nodes is not None else (None,):
            _EPOCH[(cluster_id, node)] = _EPOCH.get((cluster_id, node), 0) + 1
            woken.extend(_WAITERS.pop((cluster_id, node), ()))
        _COND.notify_all()
    for loop, future in woken:
        try:
            loop.call_soon_threadsafe(_settle, future, True)
        except RuntimeError:  # its loop was closed meanwhile
            pass


def _settle(future: asyncio.Future, value: bool) -> None:
    if not future.done():
        future.set_result(value)


def redis_url() -> str:
    """The Redis that carries wakeups between processes ("" when there is none)."""
    for url in (getattr(settings, "CACHE_URL", None), getattr(settings, "CELERY_BROKER_URL", None)):
        if url and str(url).startswith(("redis://", "rediss://", "unix://")):
            return str(url)
    return ""


def _channel() -> str:
    # The database name keeps deployments (and test runs) that share one Redis apart.
    return f"topoweb:{connection.settings_dict['NAME']}:agent-wakeups"


def notify_cluster(cluster_id: int, nodes: Iterable[str] | None = None) -> None:
    """Wake the long-polls of `nodes` (all of the cluster's when None) once the current
    transaction commits: this process's at once, other processes' through Redis if configured."""
    names = None if nodes is None else tuple(sorted(set(nodes)))
    url = redis_url()
    channel = _channel() if url else ""

    def wake() -> None:
        _bump(cluster_id, names)
        if url:
            _publish(url, channel, cluster_id, names)

    transaction.on_commit(wake, robust=True)


def _publish(url: str, channel: str, cluster_id: int, names: tuple[str, ...] | None) -> None:
    import redis

    message = json.dumps({"origin": _ORIGIN, "cluster": cluster_id, "nodes": names})
    try:
        client = _PUBLISHERS.get(url)
        if client is None:
            # Thread-safe, with its own connection pool: one per Redis for the process.
            client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
            _PUBLISHERS[url] = client
        client.publish(channel, message)
    except redis.RedisError as exc:
        # The polls of other processes end at their timeout instead.
        log.warning("could not publish an agent wakeup: %s", exc)


def _listen(url: str, channel: str) -> None:
    """Apply other processes' wakeups published on `channel`; reconnects after a failure."""
    import redis

    while True:
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=2.0, health_check_interval=30)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(channel)
            for item in pubsub.listen():
                _apply(item.get("data"))
        except redis.RedisError as exc:
            log.warning("agent wakeups from other processes paused (%s); retrying", exc)
            time.sleep(2.0)


def _apply(data) -> None:
    """Bump the counters a published wakeup names (malformed or own messages are ignored)."""
    try:
        message = json.loads(data)
        if message.get("origin") == _ORIGIN:
            return
        nodes = message.get("nodes")
        names = None if nodes is None else tuple(str(n) for n in nodes)
        _bump(int(message["cluster"]), names)
    except (TypeError, ValueError, KeyError, AttributeError):
        log.warning("ignored a malformed agent wakeup: %r", data)


def listen_for_other_processes() -> bool:
    """Start (once per process) the thread that applies wakeups published by other processes;
    False when no Redis is configured."""
    global _LISTENER
    url = redis_url()
    if not url:
        return False
    with _LISTENER_LOCK:
        if _LISTENER is None or not _LISTENER.is_alive():
            _LISTENER = threading.Thread(
                target=_listen, args=(url, _channel()), name="agent-wakeups", daemon=True
            )
            _LISTENER.start()
    return True


def wait_for_change(cluster_id: int, node: str, since: tuple[int, int], timeout_s: float) -> bool:
    """Block until the node's or the cluster's counter moves past `since` or `timeout_s` passes;
    True if it moved."""
    listen_for_other_processes()
    with _COND:
        return _COND.wait_for(lambda: epoch_unlocked(cluster_id, node) != since, timeout=timeout_s)


def epoch_unlocked(cluster_id: int, node: str) -> tuple[int, int]:
    return _EPOCH.get((cluster_id, None), 0), _EPOCH.get((cluster_id, node), 0)


async def changed(cluster_id: int, node: str, since: tuple[int, int], timeout_s: float) -> bool:
    """`wait_for_change` for an event loop: no thread is held while waiting, only a future that a
    change of the node's or the cluster's counter resolves (from any thread); True if it moved."""
    listen_for_other_processes()
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    keys = ((cluster_id, None), (cluster_id, node))
    with _COND:
        if epoch_unlocked(cluster_id, node) != since:
            return True
        for key in keys:
            _WAITERS.setdefault(key, set()).add((loop, future))
    timer = loop.call_later(timeout_s, _settle, future, False)
    try:
        return await future
    finally:
        timer.cancel()
        with _COND:
            for key in keys:
                waiting = _WAITERS.get(key)
                if waiting is not None:
                    waiting.discard((loop, future))
                    if not waiting:
                        del _WAITERS[key]

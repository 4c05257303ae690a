"""A Redis cache that fails open: with Redis down, reads miss and writes are dropped.

What the cache holds here is advisory (API throttling counters, the scheduling cycle's coalescing
key), so losing it for a while must not cost a request: throttling then lets requests through and
every cycle request queues its own cycle. Each failure is logged, at most once per LOG_EVERY_S.
"""

from __future__ import annotations

import functools
import logging
import time

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

LOG_EVERY_S = 30.0


_last_logged = float("-inf")


def _degraded(op: str, exc: Exception) -> None:
    global _last_logged
    now = time.monotonic()
    if now - _last_logged >= LOG_EVERY_S:
        _last_logged = now
        log.warning("cache unavailable, %s degraded (fails open): %s", op, exc)


def _fails_open(method, answer):
    """`method` of RedisCache, answering `answer(*args, **kwargs)` instead of a Redis error."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except RedisError as exc:
            _degraded(method.__name__, exc)
            return answer(*args, **kwargs)

    return guarded


def _missing(*args, **kwargs):
    return None


def _absent(key, *args, **kwargs):
    raise ValueError(f"Key '{key}' not found.")


# INCRBY only if the key exists (Django's incr raises ValueError otherwise): one round trip, where
# Django's client asks EXISTS first.
_INCR_EXISTING = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end
return false
"""


# Each key's counter in its window: INCR, and on the window's first request EXPIRE with it (one
# round trip for every key; the counter is the plain integer `add` would have stored).
_COUNT_WINDOWS = """
local out = {}
for i, key in ipairs(KEYS) do
  local n = redis.call('INCR', key)
  if n == 1 then redis.call('EXPIRE', key, ARGV[i]) end
  out[i] = n
end
return out
"""


class ReusedClientRedisCacheClient(RedisCacheClient):
    """Django's Redis cache client keeping one redis.Redis per connection pool. Django builds a new
    one for every call, and redis-py's constructor (its table of ~160 response callbacks) took more
    CPU than the command it sent: a fifth of an API submission's CPU went to six of them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        index = self._get_connection_pool_index(write)
        client = self._clients.get(index)
        if client is None:
            # redis.Redis is safe to share between threads: each command takes a pool connection.
            client = self._clients[index] = self._client(connection_pool=self._get_connection_pool(write))
        return client

    def incr(self, key, delta):
        client = self.get_client(key, write=True)
        value = client.eval(_INCR_EXISTING, 1, key, delta)
        if value is None:
            raise ValueError(f"Key '{key}' not found.")
        return value

    def count_windows(self, keys, timeouts):
        client = self.get_client(keys[0], write=True)
        return client.eval(_COUNT_WINDOWS, len(keys), *keys, *timeouts)


class FailOpenRedisCache(RedisCache):
    """Django's RedisCache whose get/add/set/incr/touch/delete, their *_many forms and has_key
    never raise a Redis error: they answer as if the key were absent (`add` as if it were added,
    `incr` with ValueError, `set_many` as if every key failed), and so does `count_windows` (the
    throttles' counters, every one 1). One redis.Redis client per pool is
    reused, and `incr` is one round trip."""

    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = ReusedClientRedisCacheClient

    add = _fails_open(RedisCache.add, lambda *args, **kwargs: True)
    get = _fails_open(RedisCache.get, lambda key, default=None, *args, **kwargs: default)
    set = _fails_open(RedisCache.set, _missing)
    incr = _fails_open(RedisCache.incr, _absent)
    touch = _fails_open(RedisCache.touch, lambda *args, **kwargs: False)
    delete = _fails_open(RedisCache.delete, lambda *args, **kwargs: False)
    get_many = _fails_open(RedisCache.get_many, lambda *args, **kwargs: {})
    set_many = _fails_open(RedisCache.set_many, lambda data, *args, **kwargs: list(data))
    delete_many = _fails_open(RedisCache.delete_many, _missing)
    has_key = _fails_open(RedisCache.has_key, lambda *args, **kwargs: False)

    def _count_windows(self, windows):
        """Each (key, timeout) counter of `windows` counted up by one, created expiring after its
        timeout when absent; their new values, in one round trip."""
        keys = [self.make_and_validate_key(key) for key, _ in windows]
        timeouts = [max(1, int(self.get_backend_timeout(timeout))) for _, timeout in windows]
        return [int(n) for n in self._cache.count_windows(keys, timeouts)]

    # With Redis down every window counts 1: throttling lets requests through.
    count_windows = _fails_open(_count_windows, lambda windows: [1] * len(windows))

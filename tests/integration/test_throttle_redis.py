"""The fixed-window API throttles on a real Redis: the counter is one integer key expiring with its
window, counted by one round trip per request, and the limit, the wait and the next window hold."""

from __future__ import annotations

import pytest
import redis
from rest_framework.throttling import SimpleRateThrottle

from apps.api.throttling import CallerRateThrottle
from topoweb.cache import FailOpenRedisCache


class Request:
    class user:  # noqa: N801
        pk = 4242
        is_authenticated = True
        is_superuser = False

    auth = None
    META = {"REMOTE_ADDR": "10.0.0.9"}


@pytest.fixture
def redis_cache(require_redis, monkeypatch):
    cache = FailOpenRedisCache(require_redis, {"KEY_PREFIX": "throttle-test"})
    client = cache._cache.get_client(write=True)

    def forget():  # only this test's keys: the broker's database holds others
        for key in client.scan_iter(match="throttle-test:*"):
            client.delete(key)

    forget()
    monkeypatch.setattr(SimpleRateThrottle, "cache", cache)
    yield cache
    forget()


def test_incr_is_one_round_trip_and_keeps_the_expiry(redis_cache, monkeypatch):
    with pytest.raises(ValueError):
        redis_cache.incr("absent")
    assert redis_cache.get("absent") is None  # not created by the failed incr
    assert redis_cache.add("counter", 1, 60)
    sent = []
    original = redis.Redis.execute_command
    monkeypatch.setattr(
        redis.Redis,
        "execute_command",
        lambda self, *args, **kw: sent.append(args[0]) or original(self, *args, **kw),
    )
    assert redis_cache.incr("counter") == 2
    assert sent == ["EVAL"]
    monkeypatch.undo()
    assert redis_cache.get("counter") == 2
    client = redis_cache._cache.get_client(write=True)
    assert 0 < client.ttl(redis_cache.make_key("counter")) <= 60


def test_n_requests_then_refused_until_the_next_window(redis_cache, monkeypatch):
    now = [1_800_000_050.0]  # 50 s into a minute-long window
    monkeypatch.setattr(SimpleRateThrottle, "timer", staticmethod(lambda: now[0]))
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "3/min"})
    answers = [CallerRateThrottle().allow_request(Request(), None) for _ in range(4)]
    assert answers == [True, True, True, False]
    refused = CallerRateThrottle()
    assert not refused.allow_request(Request(), None)
    assert refused.wait() == 10
    assert redis_cache.get(refused.key) == 5
    now[0] += 10
    assert CallerRateThrottle().allow_request(Request(), None)

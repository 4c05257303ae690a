"""The fixed-window API throttles on a real Redis: the counter is one integer key expiring with its
window, counted by one round trip per request (a submission's two counters together), and the
limit, the wait and the next window hold."""

from __future__ import annotations

import pytest
import redis
from rest_framework.exceptions import Throttled
from rest_framework.throttling import SimpleRateThrottle

from apps.api.throttling import CallerRateThrottle, CountsWindowsTogether, ScopedCallerThrottle
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


def commands_sent(monkeypatch) -> list[str]:
    """The names of the Redis commands sent from now on (until `monkeypatch.undo()`)."""
    sent: list[str] = []
    original = redis.Redis.execute_command
    monkeypatch.setattr(
        redis.Redis,
        "execute_command",
        lambda self, *args, **kw: sent.append(args[0]) or original(self, *args, **kw),
    )
    return sent


def test_incr_is_one_round_trip_and_keeps_the_expiry(redis_cache, monkeypatch):
    with pytest.raises(ValueError):
        redis_cache.incr("absent")
    assert redis_cache.get("absent") is None  # not created by the failed incr
    assert redis_cache.add("counter", 1, 60)
    sent = commands_sent(monkeypatch)
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


class SubmitView(CountsWindowsTogether):
    """What CountsWindowsTogether needs of a view: its throttles, its scope and `throttled`."""

    throttle_scope = "submit"

    def get_throttles(self):
        return [CallerRateThrottle(), ScopedCallerThrottle()]

    def throttled(self, request, wait):
        raise Throttled(wait)


def test_a_submissions_two_counters_are_one_round_trip(redis_cache, monkeypatch):
    now = [1_800_000_050.0]  # 50 s into a minute-long window
    monkeypatch.setattr(SimpleRateThrottle, "timer", staticmethod(lambda: now[0]))
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "100/min", "submit": "2/min"})
    sent = commands_sent(monkeypatch)
    SubmitView().check_throttles(Request())
    assert sent == ["EVAL"]
    SubmitView().check_throttles(Request())
    with pytest.raises(Throttled) as refused:
        SubmitView().check_throttles(Request())
    assert refused.value.wait == 10
    monkeypatch.undo()
    # Both counters are plain integers expiring with their window, as `add` and `incr` keep them.
    client = redis_cache._cache.get_client(write=True)
    keys = sorted(client.scan_iter(match="throttle-test:*"))
    assert len(keys) == 2 and all(0 < client.ttl(key) <= 60 for key in keys)
    assert sorted(int(client.get(key)) for key in keys) == [3, 3]
    # The next window starts again at 1.
    now[0] += 10
    SubmitView().check_throttles(Request())


def test_counted_windows_start_at_one_and_expire(redis_cache):
    assert redis_cache.count_windows([("a", 60), ("b", 5)]) == [1, 1]
    assert redis_cache.count_windows([("a", 60), ("b", 5)]) == [2, 2]
    assert redis_cache.get("a") == 2 and redis_cache.incr("b") == 3
    client = redis_cache._cache.get_client(write=True)
    assert 55 < client.ttl(redis_cache.make_key("a")) <= 60 and 0 < client.ttl(redis_cache.make_key("b")) <= 5

"""API throttles count requests in fixed windows: the rate's number of requests per window, then
429 with Retry-After until the window ends; one counter per caller and scope, whatever the rate."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework.throttling import SimpleRateThrottle

from apps.api.throttling import CallerRateThrottle, ScopedCallerThrottle

from .conftest import small_spec

pytestmark = pytest.mark.django_db


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    # 20 s into a minute-long window.
    clock = Clock(1_800_000_020.0)
    monkeypatch.setattr(SimpleRateThrottle, "timer", clock)
    cache.clear()
    yield clock
    cache.clear()


def post(client, name: str):
    return client.post("/api/v1/jobs/", small_spec(name, 1), format="json")


def test_n_submissions_then_429_with_retry_after_until_the_window_ends(case44, alice_api, clock, monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"submit": "3/min", "user": "1000/min"})
    assert [post(alice_api, f"a{i}").status_code for i in range(3)] == [201, 201, 201]
    refused = post(alice_api, "a3")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "40"
    assert "Expected available in 40 seconds" in refused.json()["detail"]
    clock.now += 30
    refused = post(alice_api, "a4")
    assert refused.status_code == 429 and refused["Retry-After"] == "10"
    # Reads are under the user scope only.
    assert alice_api.get("/api/v1/jobs/").status_code == 200
    clock.now += 10  # the next window
    assert [post(alice_api, f"b{i}").status_code for i in range(4)] == [201, 201, 201, 429]


def test_the_per_caller_rate_refuses_reads_too_and_each_caller_has_its_own(
    case44, alice_api, make_user, clock, monkeypatch
):
    from .conftest import token_client

    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "2/s"})
    assert [alice_api.get("/api/v1/jobs/").status_code for _ in range(3)] == [200, 200, 429]
    bob = token_client(make_user("bob"))
    assert bob.get("/api/v1/jobs/").status_code == 200
    clock.now += 1
    assert alice_api.get("/api/v1/jobs/").status_code == 200


class View:
    throttle_scope = "submit"


class Request:
    """What the throttles read of a request: an authenticated user, no launcher token."""

    class user:  # noqa: N801
        pk = 7
        is_authenticated = True
        is_superuser = False

    auth = None
    META = {"REMOTE_ADDR": "10.0.0.1"}


def test_a_window_is_one_counter_whatever_the_rate(clock, monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"submit": "1000/min", "user": "1000/min"})
    for _ in range(1000):
        assert ScopedCallerThrottle().allow_request(Request(), View())
    throttle = ScopedCallerThrottle()
    assert not throttle.allow_request(Request(), View())
    # One integer per scope and window, not a list of every request's time.
    assert cache.get(throttle.key) == 1001
    assert throttle.wait() == 40


def test_each_request_costs_one_cache_call_per_scope_after_the_first(clock, monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "5/min"})
    calls = []
    for name in ("get", "set", "add", "incr"):
        original = getattr(cache, name)
        monkeypatch.setattr(
            cache, name, lambda *a, _n=name, _o=original, **k: calls.append(_n) or _o(*a, **k)
        )
    CallerRateThrottle().allow_request(Request(), View())
    assert calls == ["incr", "add"]
    calls.clear()
    CallerRateThrottle().allow_request(Request(), View())
    assert calls == ["incr"]


def test_the_window_counter_expires_with_the_window(clock, monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "5/min"})
    added = []
    original = cache.add
    monkeypatch.setattr(
        cache, "add", lambda key, value, timeout: added.append(timeout) or original(key, value, timeout)
    )
    CallerRateThrottle().allow_request(Request(), View())
    assert added == [60]


def test_a_counter_created_by_another_process_meanwhile_is_counted_on(clock, monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "2/min"})
    throttle = CallerRateThrottle()
    original = cache.incr
    missed = []

    def incr(key, delta=1):
        if not missed:
            missed.append(key)
            cache.set(key, 2, 60)  # another process's two requests, just after this one's miss
            raise ValueError(key)
        return original(key, delta)

    monkeypatch.setattr(cache, "incr", incr)
    # add() finds the counter, so the request is the third of the window.
    assert not throttle.allow_request(Request(), View())
    assert cache.get(throttle.key) == 3


def test_operators_count_on_their_own_rate_only_past_the_users(clock, monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"submit": "1/min", "submit_operator": "2/min"})
    monkeypatch.setattr("apps.api.throttling._operates", lambda request: True)
    answers = [ScopedCallerThrottle().allow_request(Request(), View()) for _ in range(4)]
    assert answers == [True, True, True, False]

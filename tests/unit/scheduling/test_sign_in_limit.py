"""The sign-in limit under concurrency, on the embedded demo's in-memory cache: 200 simultaneous
wrong passwords for one (username, address) pair get at most LOGIN_FAILURE_LIMIT password checks
(counted where the backend checks the password, the check slowed so that every attempt is in
flight at once); the owner's own sign-ins do not use the pair's attempts up; another address is not
slowed. The same on Postgres and Redis: tests/integration/test_sign_in_limit_redis.py."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory

from apps.api.logins import ThrottledModelBackend, check_num_proxies

ATTEMPTS = 200
LIMIT = 10


@pytest.fixture(autouse=True)
def fresh(settings):
    settings.LOGIN_FAILURE_LIMIT = LIMIT
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def counted_checks(monkeypatch):
    """Every password check the backend makes, counted; each takes 20 ms and fails unless the
    password is "right"."""
    checks = []
    lock = threading.Lock()

    def check(self, request, username=None, password=None, **kwargs):
        with lock:
            checks.append(password)
        time.sleep(0.02)
        return object() if password == "right" else None

    monkeypatch.setattr(ModelBackend, "authenticate", check)
    return checks


def attempt(address: str, password: str = "wrong") -> str:
    request = RequestFactory().post("/accounts/login/", REMOTE_ADDR=address)
    try:
        user = ThrottledModelBackend().authenticate(request, username="alice", password=password)
    except PermissionDenied:
        return "refused"
    return "failed" if user is None else "signed in"


def test_200_concurrent_wrong_passwords_get_at_most_the_limit_of_checks(counted_checks):
    start = threading.Barrier(ATTEMPTS)
    outcomes = []

    def run():
        start.wait(30)
        outcomes.append(attempt("10.0.0.1"))

    threads = [threading.Thread(target=run) for _ in range(ATTEMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == ATTEMPTS
    assert len(counted_checks) == LIMIT
    assert outcomes.count("failed") == LIMIT and outcomes.count("refused") == ATTEMPTS - LIMIT
    # The right password from the same address is refused unchecked for the rest of the window...
    assert attempt("10.0.0.1", "right") == "refused"
    assert len(counted_checks) == LIMIT
    # ...and from another address goes through at once.
    assert attempt("10.9.9.9", "right") == "signed in"


def test_successful_sign_ins_do_not_use_the_pairs_attempts_up(counted_checks):
    for _ in range(3 * LIMIT):
        assert attempt("10.0.0.2", "right") == "signed in"
    for _ in range(LIMIT):
        assert attempt("10.0.0.2") == "failed"
    assert attempt("10.0.0.2", "right") == "refused"


def test_the_window_ends(counted_checks, settings):
    settings.LOGIN_FAILURE_WINDOW_S = 1
    for _ in range(LIMIT):
        attempt("10.0.0.3")
    assert attempt("10.0.0.3", "right") == "refused"
    time.sleep(1.2)
    assert attempt("10.0.0.3", "right") == "signed in"


def test_check_deploy_warns_without_num_proxies_in_production(settings):
    settings.DEBUG = False
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 0}
    assert [w.id for w in check_num_proxies()] == ["api.W001"]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    assert check_num_proxies() == []
    settings.DEBUG = True
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 0}
    assert check_num_proxies() == []


def test_a_forwarded_request_without_num_proxies_is_logged_once(settings, caplog, monkeypatch):
    from apps.api import logins

    monkeypatch.setattr(logins, "_warned_forwarded", False)
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 0}
    for _ in range(3):
        request = RequestFactory().get("/", HTTP_X_FORWARDED_FOR="203.0.113.7", REMOTE_ADDR="10.0.0.254")
        assert logins.client_address(request) == "10.0.0.254"
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "TOPOWEB_NUM_PROXIES" in caplog.records[0].message

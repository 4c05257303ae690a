"""The sign-in limit on the production services: users in Postgres, the counters in Redis (the
fail-open cache of production), real password hashes. 200 simultaneous wrong passwords for one
(username, address) pair get at most LOGIN_FAILURE_LIMIT password checks, counted by a hasher
that counts its verifications (and takes a few ms each, so that the attempts overlap)."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import MD5PasswordHasher
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test import RequestFactory

from apps.api import logins
from topoweb.cache import FailOpenRedisCache

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres")]

ATTEMPTS = 200
LIMIT = 10
PREFIX = "sign-in-limit-test"


class CountingHasher(MD5PasswordHasher):
    """MD5 (fast, tests only) that counts each password verification."""

    algorithm = "counting_md5"
    verified = 0
    lock = threading.Lock()

    def verify(self, password, encoded):
        with CountingHasher.lock:
            CountingHasher.verified += 1
        time.sleep(0.005)
        return super().verify(password, encoded)


@pytest.fixture
def redis_counters(require_redis, monkeypatch):
    cache = FailOpenRedisCache(require_redis, {"KEY_PREFIX": PREFIX})
    client = cache._cache.get_client(write=True)

    def forget():  # only this test's keys: the broker's database holds others
        for key in client.scan_iter(match=f"{PREFIX}:*"):
            client.delete(key)

    forget()
    monkeypatch.setattr(logins, "cache", cache)
    yield cache
    forget()


def test_200_concurrent_wrong_passwords_get_at_most_the_limit_of_checks(
    transactional_db, settings, redis_counters
):
    settings.LOGIN_FAILURE_LIMIT = LIMIT
    settings.PASSWORD_HASHERS = [f"{__name__}.CountingHasher"]
    get_user_model().objects.create_user("victim", password="the-right-one")
    CountingHasher.verified = 0
    start = threading.Barrier(ATTEMPTS)
    outcomes: list[str] = []

    def attempt(address: str, password: str) -> str:
        request = RequestFactory().post("/accounts/login/", REMOTE_ADDR=address)
        try:
            user = logins.ThrottledModelBackend().authenticate(request, username="victim", password=password)
        except PermissionDenied:
            return "refused"
        finally:
            connection.close()
        return "failed" if user is None else "signed in"

    def run(i: int) -> None:
        start.wait(60)
        outcomes.append(attempt("198.51.100.7", f"guess-{i}"))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(ATTEMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(outcomes) == ATTEMPTS
    assert CountingHasher.verified == LIMIT
    assert outcomes.count("failed") == LIMIT and outcomes.count("refused") == ATTEMPTS - LIMIT
    # The counter is one Redis integer expiring with the window.
    client = redis_counters._cache.get_client(write=True)
    (key,) = list(client.scan_iter(match=f"{PREFIX}:*pair:victim*"))
    assert int(client.get(key)) == ATTEMPTS
    assert 0 < client.ttl(key) <= settings.LOGIN_FAILURE_WINDOW_S
    # The right password: refused unchecked from the guessing address, accepted from another.
    assert attempt("198.51.100.7", "the-right-one") == "refused"
    assert attempt("192.0.2.10", "the-right-one") == "signed in"
    assert CountingHasher.verified == LIMIT + 1

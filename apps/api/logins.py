"""Failed sign-in and token throttling that cannot be turned on others.

Sign-ins (the login page and the admin's, through the authentication backend): each
(username, client address) pair gets at most LOGIN_FAILURE_LIMIT password checks within
LOGIN_FAILURE_WINDOW_S of its first attempt. The attempt is counted (one atomic increment of the
pair's counter, which expires with the window) before the password is hashed, and an attempt past
the limit is refused without a check: however many arrive at once, no more than the limit are
checked. A successful sign-in gives its count back, so the owner's own sign-ins never use up the
pair's attempts. The same username from another address, and other usernames from the same
address, are not slowed: an attacker slows themself, not the owner (as long as addresses are told
apart: TOPOWEB_NUM_PROXIES behind a proxy, else every client has the proxy's address).

API credentials (user, launcher and node tokens): a presented key is always checked, so a valid
credential is never refused because of anyone else's failures. Failed keys count per client
address and per key prefix; past LOGIN_FAILURE_LIMIT_PER_IP (address) or LOGIN_FAILURE_LIMIT
(prefix) within the window, a failed key is answered 429 instead of 401.

The client address is the one DRF's throttles use: the socket's, or through TOPOWEB_NUM_PROXIES
trusted proxies the matching entry of X-Forwarded-For. Counters live in the default cache: Redis
in production (atomic across processes), the process's memory in the embedded demo (atomic within
its one process).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from rest_framework.throttling import BaseThrottle

log = logging.getLogger(__name__)

PREFIX = "login-failures:"
TOKEN_PREFIX_CHARS = 8
_warned_forwarded = False


def client_address(request) -> str | None:
    """The caller's address: the socket's, or through TOPOWEB_NUM_PROXIES proxies the client's.
    A request forwarded by a proxy (X-Forwarded-For) while TOPOWEB_NUM_PROXIES is 0 is logged
    once per process: every client then shares the proxy's address."""
    global _warned_forwarded
    if request is None or not getattr(request, "META", None):
        return None
    if not _warned_forwarded and "HTTP_X_FORWARDED_FOR" in request.META and not _num_proxies():
        _warned_forwarded = True
        log.warning(
            "a request came through a proxy (X-Forwarded-For) but TOPOWEB_NUM_PROXIES is 0: every"
            " client behind it shares the proxy's address for sign-in limits and throttles;"
            " set TOPOWEB_NUM_PROXIES to the number of proxies in front of TopoWeb"
        )
    return BaseThrottle().get_ident(request) or None


def _num_proxies() -> int:
    return settings.REST_FRAMEWORK.get("NUM_PROXIES") or 0


def check_num_proxies(app_configs=None, **kwargs) -> list:
    """`manage.py check --deploy`: production (DEBUG off) with TOPOWEB_NUM_PROXIES 0 tells clients
    apart by the socket's address, which behind the documented TLS proxy is the proxy's for all."""
    from django.core.checks import Warning

    if settings.DEBUG or _num_proxies():
        return []
    return [
        Warning(
            "TOPOWEB_NUM_PROXIES is 0: behind a proxy every client has the proxy's address, so one"
            " client's failed sign-ins slow everyone's and the per-address limits count all clients"
            " together.",
            hint="Set TOPOWEB_NUM_PROXIES to the number of proxies in front of TopoWeb (1 behind the"
            " TLS proxy of docs/operations.md); keep it 0 only when clients reach TopoWeb directly.",
            id="api.W001",
        )
    ]


def count(key: str, timeout: float) -> int:
    """One more in the counter `key` (created expiring after `timeout` s), atomically: the new
    count. Each cache operation used is atomic (Redis: INCRBY of an existing key in one script,
    SET NX; in-memory: under the cache's lock), so concurrent callers get distinct counts."""
    while True:
        try:
            return cache.incr(key)
        except ValueError:  # absent (or just expired)
            pass
        if cache.add(key, 1, timeout=timeout):
            return 1
        # Another caller created it in between: count in it.


def token_failure_keys(request, key: str | None) -> list[tuple[str, int]]:
    """The counters a failed API key counts against, each with its limit."""
    keys = []
    address = client_address(request)
    if address:
        keys.append((f"{PREFIX}ip:{address}", settings.LOGIN_FAILURE_LIMIT_PER_IP))
    if key:
        keys.append((f"{PREFIX}key:{key[:TOKEN_PREFIX_CHARS]}", settings.LOGIN_FAILURE_LIMIT))
    return keys


def failures_exceeded(keys: list[tuple[str, int]]) -> bool:
    """True if any counter has reached its limit."""
    counts = cache.get_many([k for k, _ in keys])
    return any(counts.get(k, 0) >= limit for k, limit in keys)


def failure_record(keys: list[tuple[str, int]]) -> None:
    """Count one failed attempt against each counter (the window starts at the first failure)."""
    for key, _ in keys:
        count(key, settings.LOGIN_FAILURE_WINDOW_S)


def _pair_key(request, username: str) -> str:
    return f"{PREFIX}pair:{username[:150]}|{client_address(request) or '-'}"


def sign_in_attempt(request, username: str | None) -> bool:
    """Count a password check of the (username, address) pair before it is made: False when the
    pair has had LOGIN_FAILURE_LIMIT checks in its window already (then none may be made)."""
    if not username:
        return True
    return (
        count(_pair_key(request, username), settings.LOGIN_FAILURE_WINDOW_S) <= settings.LOGIN_FAILURE_LIMIT
    )


def sign_in_succeeded(request, username: str | None) -> None:
    """Give a successful sign-in's count back to its pair."""
    if not username:
        return
    try:
        cache.decr(_pair_key(request, username))
    except ValueError:  # the window ended meanwhile
        pass


class ThrottledModelBackend(ModelBackend):
    """Django's model backend, refusing usernames and addresses with too many recent failures."""

    def get_all_permissions(self, user_obj, obj=None):
        """Django's answer (the user's and their groups' permissions, cached on the user object)
        read in one query instead of two: every API request that checks a role pays it."""
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            if user_obj.is_superuser:
                return super().get_all_permissions(user_obj, obj)
            from django.contrib.auth.models import Permission

            fields = ("content_type__app_label", "codename")
            own = Permission.objects.filter(user=user_obj).values_list(*fields).order_by()
            grouped = Permission.objects.filter(group__user=user_obj).values_list(*fields).order_by()
            user_obj._perm_cache = {f"{app}.{codename}" for app, codename in own.union(grouped)}
        return user_obj._perm_cache

    def authenticate(self, request, username=None, password=None, **kwargs):
        name = username if username is not None else kwargs.get("username")
        if password is None:
            return None  # no password check to make (ModelBackend makes none either)
        if not sign_in_attempt(request, name):
            # PermissionDenied stops every backend: the attempt fails without a password check.
            minutes = settings.LOGIN_FAILURE_WINDOW_S // 60
            raise PermissionDenied(
                f"too many failed sign-ins of this username from this address; try again within {minutes} minutes"
            )
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None:
            sign_in_succeeded(request, name)
        return user

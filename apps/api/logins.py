"""Failed sign-in and token throttling that cannot be turned on others.

Sign-ins (the login page and the admin's, through the authentication backend): failures count per
(username, client address) pair. After LOGIN_FAILURE_LIMIT failures within
LOGIN_FAILURE_WINDOW_S, that pair must wait before its next attempt: 1 s after the limit, then
twice as long after each further failure, at most LOGIN_DELAY_MAX_S; an attempt made sooner is
refused without checking the password. The same username from another address, and other
usernames from the same address, are not slowed: an attacker slows themself, not the owner.

API credentials (user, launcher and node tokens): a presented key is always checked, so a valid
credential is never refused because of anyone else's failures. Failed keys count per client
address and per key prefix; past LOGIN_FAILURE_LIMIT_PER_IP (address) or LOGIN_FAILURE_LIMIT
(prefix) within the window, a failed key is answered 429 instead of 401.

The client address is the one DRF's throttles use: the socket's, or through TOPOWEB_NUM_PROXIES
trusted proxies the matching entry of X-Forwarded-For.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from rest_framework.throttling import BaseThrottle

PREFIX = "login-failures:"
TOKEN_PREFIX_CHARS = 8


def client_address(request) -> str | None:
    """The caller's address: the socket's, or through TOPOWEB_NUM_PROXIES proxies the client's."""
    if request is None or not getattr(request, "META", None):
        return None
    return BaseThrottle().get_ident(request) or None


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
        if not cache.add(key, 1, timeout=settings.LOGIN_FAILURE_WINDOW_S):
            try:
                cache.incr(key)
            except ValueError:
                # Expired between add() and incr(): this failure starts a new window.
                cache.add(key, 1, timeout=settings.LOGIN_FAILURE_WINDOW_S)


def _pair_key(request, username: str) -> str:
    return f"{PREFIX}pair:{username[:150]}|{client_address(request) or '-'}"


def sign_in_wait_s(request, username: str | None) -> float:
    """Seconds this (username, address) pair must still wait before its next attempt (0: none)."""
    if not username:
        return 0.0
    state = cache.get(_pair_key(request, username))
    if not state:
        return 0.0
    return max(0.0, state[1] - time.time())


def sign_in_failed(request, username: str | None) -> None:
    """Count a failed sign-in of the pair; past the limit, set when it may try again."""
    if not username:
        return
    key = _pair_key(request, username)
    count = (cache.get(key) or (0, 0.0))[0] + 1
    over = count - settings.LOGIN_FAILURE_LIMIT
    delay = 0.0 if over < 0 else min(2.0**over, settings.LOGIN_DELAY_MAX_S)
    cache.set(key, (count, time.time() + delay), timeout=settings.LOGIN_FAILURE_WINDOW_S)


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
        wait_s = sign_in_wait_s(request, name)
        if wait_s > 0:
            # PermissionDenied stops every backend: the attempt fails without a password check.
            raise PermissionDenied(f"too many failed sign-ins; try again in {wait_s:.0f} s")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            sign_in_failed(request, name)
        return user

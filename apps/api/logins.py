"""Failed sign-in throttling: after LOGIN_FAILURE_LIMIT failures within LOGIN_FAILURE_WINDOW_S for
one username, or LOGIN_FAILURE_LIMIT_PER_IP from one address, further attempts are refused
without checking the password until the window passes. Covers the login page, the admin site's
login (both go through the authentication backend) and API tokens (through the API's
authentication classes)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied

PREFIX = "login-failures:"


def _address(request) -> str | None:
    if request is None:
        return None
    # The socket's address: X-Forwarded-For is the client's to write.
    return request.META.get("REMOTE_ADDR") or None


def failure_keys(request, username: str | None = None) -> list[tuple[str, int]]:
    """The counters an attempt counts against, each with its limit."""
    keys = []
    if username:
        keys.append((f"{PREFIX}user:{username[:150]}", settings.LOGIN_FAILURE_LIMIT))
    address = _address(request)
    if address:
        keys.append((f"{PREFIX}ip:{address}", settings.LOGIN_FAILURE_LIMIT_PER_IP))
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
        keys = failure_keys(request, name)
        if failures_exceeded(keys):
            # PermissionDenied stops every backend: the attempt fails without a password check.
            raise PermissionDenied("too many failed sign-ins; try again later")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            failure_record(keys)
        return user

"""API authentication plumbing: user tokens (`Authorization: Token <key>`), the base of the key
credentials that are not users (`Authorization: <keyword> <key>`: the scheduling app's launcher and
node tokens, apps/scheduling/api/authentication.py) and how a permission or throttle tells them
apart (`launcher_of`, `node_token_of`, by the kind of caller their authentication declares). Failed
token attempts count against the caller's address like failed sign-ins (see logins.py).

Every API view authenticates with the project's default (settings REST_FRAMEWORK
DEFAULT_AUTHENTICATION_CLASSES: user tokens, sessions, launcher tokens) unless it names its own."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, Throttled

from .logins import failure_record, failures_exceeded, token_failure_keys


def _guarded(request, check):
    """`check()`, always: a valid key is never refused for others' failures. A failed key counts
    against the caller's address and the key's prefix; past either limit it is a 429, not a 401."""
    try:
        return check()
    except AuthenticationFailed:
        parts = get_authorization_header(request).split()
        presented = parts[1].decode(errors="replace") if len(parts) == 2 else None
        keys = token_failure_keys(request, presented)
        failure_record(keys)
        if failures_exceeded(keys):
            raise Throttled(
                detail="too many failed authentication attempts from this address or with this key; try again later"
            ) from None
        raise


# A valid user token is remembered per process for USER_TOKEN_CACHE_S seconds with its user, the
# user's account and permissions (roles): a client's burst of requests costs one token query and
# one permission query per process, not one each per request (the token query was a fifth of a
# submission's CPU, the permission query the largest part of a GET's). Deleting a token, saving or
# deleting a user, membership, account, group or permission, or changing a user's groups or a
# group's permissions forgets every remembered token of the process at once (user_tokens_forget);
# the other web processes follow within USER_TOKEN_CACHE_S.
USER_TOKEN_CACHE_S = 5.0
USER_TOKEN_CACHE_SIZE = 4096
_USERS: dict[str, tuple[object, object, float]] = {}
# What else a remembered user carries, read when it is remembered: functions of the user that read
# and set it on the user object, registered by the apps that own it (the scheduling app: the
# accounts the user coordinates, which decide the jobs they see). Forgotten with the token.
REMEMBERED_WITH_USER: list[Callable[[Any], object]] = []


def user_tokens_forget(**kwargs) -> None:
    """Drop every remembered user token (a signal receiver: after a token, user, membership or
    account was saved or deleted)."""
    _USERS.clear()


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's user token authentication, with failed keys counted per address and valid ones
    remembered with their user's permissions for USER_TOKEN_CACHE_S seconds."""

    def authenticate(self, request):
        return _guarded(request._request, lambda: super(TokenAuthentication, self).authenticate(request))

    def authenticate_credentials(self, key):
        now = time.monotonic()
        hit = _USERS.get(key)
        if hit is not None and hit[2] > now:
            # A copy per request: what a request caches on its user (permissions) stays its own.
            return copy.copy(hit[1]), hit[0]
        # The key is the primary key: no ORDER BY (first() would add one), one index lookup.
        found = list(self.get_model().objects.select_related("user").filter(key=key)[:1])
        token = found[0] if found else None
        if token is None:
            raise AuthenticationFailed("Invalid token.")
        if not token.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        if len(_USERS) >= USER_TOKEN_CACHE_SIZE:
            _USERS.clear()
        remembered = copy.copy(token.user)
        # Read now (one query) and kept on the remembered user, so each request's copy has them.
        remembered._perm_cache = frozenset(remembered.get_all_permissions())
        for remember in REMEMBERED_WITH_USER:
            remember(remembered)
        _USERS[key] = (token, remembered, now + USER_TOKEN_CACHE_S)
        return copy.copy(remembered), token


# A valid launcher or node key is remembered per process for KEY_CACHE_S seconds (thousands of
# agents authenticate every poll): a deleted or revoked token stops working within that time, and
# at once in the process that revoked it (node_tokens_forget). Where a kind of key can re-check
# many tokens in one statement (`_still_valid_many`), a remembered token found due is re-checked
# with every other one due within KEY_CACHE_S / 2: a few statements a minute, not one a poll.
KEY_CACHE_S = 30.0


class KeyAuthentication(BaseAuthentication):
    """`Authorization: <keyword> <key>` for a credential that is not a user: `request.auth` is the
    token row and `request.user` stays anonymous, so only the permissions that know it let it in.
    A subclass names its keyword, the kind of caller it authenticates (`caller`: "launcher",
    "node"; see `key_of`), the longest key read (`key_max`), the message for an unknown key, its
    own cache (at most `cache_size` entries) and `_lookup`."""

    keyword = ""
    caller = ""
    key_max = 0
    unknown = ""
    cache_size = 0
    cache: dict[str, tuple[Any, float]]
    recheck_lock: threading.Lock

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        return _guarded(request._request, lambda: self._token(parts))

    def _token(self, parts: list[bytes]):
        if len(parts) != 2:
            raise AuthenticationFailed(
                f"Invalid {self.keyword} header: expected 'Authorization: {self.keyword} <key>'."
            )
        try:
            key = parts[1].decode()[: self.key_max]
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed(f"Invalid {self.keyword} header: the key is not text.") from exc
        ident = self._ident(key)
        now = time.monotonic()
        hit = self.cache.get(ident)
        if hit is not None and hit[1] <= now:
            hit = self._recheck(ident, now)
        if hit is not None:
            self._used(hit[0])
            return AnonymousUser(), hit[0]
        token = self._lookup(ident)
        if token is None:
            raise AuthenticationFailed(self.unknown)
        if len(self.cache) >= self.cache_size:
            self.cache.clear()
        self.cache[ident] = (token, now + KEY_CACHE_S)
        return AnonymousUser(), token

    def _ident(self, key: str) -> str:
        """What the cache and `_lookup` know the key by."""
        return key

    def _lookup(self, ident: str):
        """The valid token known by `ident`, or None."""
        raise NotImplementedError

    def _recheck(self, ident: str, now: float) -> tuple[Any, float] | None:
        """`ident`'s remembered entry, which is due, re-checked together with every other one due
        within KEY_CACHE_S / 2 (`_still_valid_many`); those still valid are remembered for
        another KEY_CACHE_S, the others forgotten (looked up again on their next use). None:
        `ident` is forgotten."""
        with self.recheck_lock:
            hit = self.cache.get(ident)
            if hit is None or hit[1] > now:  # another thread re-checked it meanwhile
                return hit
            soon = now + KEY_CACHE_S / 2
            due = {i: token for i, (token, until) in list(self.cache.items()) if until <= soon}
            valid = self._still_valid_many(list(due.values())) if due else set()
            for i, token in due.items():
                if token.pk in valid:
                    self.cache[i] = (token, now + KEY_CACHE_S)
                else:
                    self.cache.pop(i, None)
            return self.cache.get(ident)

    def _still_valid_many(self, tokens: list) -> set[int]:
        """The ids of those remembered `tokens` still valid as they were looked up (a cheaper
        check than `_lookup` each); the others are looked up again. By default none."""
        return set()

    def _used(self, token) -> None:
        """Called on every use of a remembered token (a kind of key may record it)."""

    def authenticate_header(self, request):
        return self.keyword


def key_of(request, caller: str) -> Any:
    """The request's key credential (`request.auth`: a token row) if a KeyAuthentication of kind
    `caller` authenticated it, else None."""
    authenticator = getattr(request, "successful_authenticator", None)
    return (
        request.auth if authenticator is not None and getattr(authenticator, "caller", "") == caller else None
    )


def launcher_of(request) -> Any:
    """The request's launcher token (scheduling's LauncherToken), if it authenticated as a launcher."""
    return key_of(request, "launcher")


def node_token_of(request) -> Any:
    """The request's node token (scheduling's NodeToken), if it authenticated as a node agent."""
    return key_of(request, "node")


class KeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """OpenAPI security scheme of a KeyAuthentication: a key in the Authorization header. A
    subclass names its `target_class`, `name` and `description`."""

    description = ""

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization", "description": self.description}

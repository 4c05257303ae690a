"""API authentication: user tokens (`Authorization: Token <key>`), sessions, per-cluster
launcher tokens (`Authorization: Launcher <key>`) and per-node agent tokens (`Authorization:
Node <key>`). Failed token attempts count against the caller's address like failed sign-ins
(see logins.py)."""

from __future__ import annotations

import copy
import time
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, Throttled

from apps.scheduling.agent_models import node_key_hash
from apps.scheduling.models import LauncherToken, NodeToken

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
        # The user's account comes in the same query: a submission needs it (a join, not a query).
        # The key is the primary key: no ORDER BY (first() would add one), one index lookup.
        found = list(
            self.get_model()
            .objects.select_related("user", "user__membership", "user__membership__account")
            .filter(key=key)[:1]
        )
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
        _USERS[key] = (token, remembered, now + USER_TOKEN_CACHE_S)
        return copy.copy(remembered), token


# A valid launcher or node key is remembered per process for KEY_CACHE_S seconds (thousands of
# agents authenticate every poll): a deleted or revoked token stops working within that time, and
# at once in the process that revoked it (node_tokens_forget).
KEY_CACHE_S = 30.0
# A node token's `last_used` is written at most every NODE_LAST_USED_S seconds.
NODE_LAST_USED_S = 300.0


class KeyAuthentication(BaseAuthentication):
    """`Authorization: <keyword> <key>` for a credential that is not a user: `request.auth` is the
    token row and `request.user` stays anonymous, so only the permissions that know it let it in.
    A subclass names its keyword, the longest key read (`key_max`), the message for an unknown
    key, its own cache (at most `cache_size` entries) and `_lookup`."""

    keyword = ""
    key_max = 0
    unknown = ""
    cache_size = 0
    cache: dict[str, tuple[Any, float]]

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
        if hit is not None and hit[1] > now:
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

    def authenticate_header(self, request):
        return self.keyword


class LauncherAuthentication(KeyAuthentication):
    """Authenticates a launcher by its per-cluster token; `request.auth` is the LauncherToken."""

    keyword = "Launcher"
    key_max = 100
    unknown = "Invalid launcher token."
    cache_size = 1024
    cache: dict[str, tuple[LauncherToken, float]] = {}

    def _lookup(self, ident: str) -> LauncherToken | None:
        return LauncherToken.objects.select_related("cluster").filter(key=ident).first()


class NodeAuthentication(KeyAuthentication):
    """Authenticates a node agent by its node token; `request.auth` is the NodeToken (with its
    node and cluster): only the agent views let it in. Keys are known by their hash."""

    keyword = "Node"
    key_max = 200
    unknown = "Invalid or revoked node token."
    cache_size = 65536
    cache: dict[str, tuple[NodeToken, float]] = {}

    def _ident(self, key: str) -> str:
        return node_key_hash(key)

    def _lookup(self, ident: str) -> NodeToken | None:
        token = (
            NodeToken.objects.select_related("node__cluster")
            .filter(key_hash=ident, revoked_at__isnull=True)
            .first()
        )
        if token is not None:
            wall = timezone.now()
            if token.last_used is None or (wall - token.last_used).total_seconds() >= NODE_LAST_USED_S:
                NodeToken.objects.filter(pk=token.pk).update(last_used=wall)
                token.last_used = wall
        return token


def node_tokens_forget() -> None:
    """Drop every remembered node token (after a revocation)."""
    NodeAuthentication.cache.clear()


# Every API view authenticates with these, in this order.
AUTHENTICATION = [TokenAuthentication, SessionAuthentication, LauncherAuthentication]


def launcher_of(request) -> LauncherToken | None:
    """The request's launcher token, if it authenticated as a launcher."""
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, LauncherToken) else None


def node_token_of(request) -> NodeToken | None:
    """The request's node token, if it authenticated as a node agent."""
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, NodeToken) else None


class KeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """OpenAPI security scheme of a KeyAuthentication: a key in the Authorization header."""

    description = ""

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization", "description": self.description}


class NodeAuthenticationScheme(KeyAuthenticationScheme):
    target_class = NodeAuthentication
    name = "nodeAuth"
    description = "Per-node agent token: `Node <key>` (manage.py create_node_token)"


class LauncherAuthenticationScheme(KeyAuthenticationScheme):
    target_class = LauncherAuthentication
    name = "launcherAuth"
    description = "Per-cluster launcher token: `Launcher <key>` (manage.py create_launcher_token)"

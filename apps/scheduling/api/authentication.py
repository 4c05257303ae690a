"""Authentication of the scheduling app's key credentials: per-cluster launcher tokens
(`Authorization: Launcher <key>`) and per-node agent tokens (`Authorization: Node <key>`), on
the API's KeyAuthentication (apps/api/authentication.py), next to the models they look up.

AUTHENTICATION is the API's standard list, in order: user tokens, sessions, launcher tokens; the
project's default (settings REST_FRAMEWORK DEFAULT_AUTHENTICATION_CLASSES) names the same classes,
so views that name none (the topology API) authenticate alike.
"""

from __future__ import annotations

import functools
import threading

from django.db import connection
from django.utils import timezone
from rest_framework.authentication import SessionAuthentication

from apps.api.authentication import KeyAuthentication, KeyAuthenticationScheme, TokenAuthentication
from apps.topology.models import Node

from ..models import LauncherToken, NodeToken
from ..node_models import node_key_hash

# A node token's `last_used` is written at most every NODE_LAST_USED_S seconds.
NODE_LAST_USED_S = 300.0


class LauncherAuthentication(KeyAuthentication):
    """Authenticates a launcher by its per-cluster token; `request.auth` is the LauncherToken.
    Keys are known by their hash."""

    keyword = "Launcher"
    caller = "launcher"
    key_max = 100
    unknown = "Invalid launcher token."
    cache_size = 1024
    cache: dict[str, tuple[LauncherToken, float]] = {}
    recheck_lock = threading.Lock()

    def _ident(self, key: str) -> str:
        return node_key_hash(key)

    def _lookup(self, ident: str) -> LauncherToken | None:
        return LauncherToken.objects.select_related("cluster").filter(key_hash=ident).first()


class NodeAuthentication(KeyAuthentication):
    """Authenticates a node agent by its node token; `request.auth` is the NodeToken (with its
    node and cluster): only the agent views let it in. Keys are known by their hash."""

    keyword = "Node"
    caller = "node"
    key_max = 200
    unknown = "Invalid or revoked node token."
    cache_size = 65536
    cache: dict[str, tuple[NodeToken, float]] = {}
    recheck_lock = threading.Lock()

    def _ident(self, key: str) -> str:
        return node_key_hash(key)

    def _lookup(self, ident: str) -> NodeToken | None:
        token = (
            NodeToken.objects.select_related("node__cluster")
            .filter(key_hash=ident, revoked_at__isnull=True)
            .first()
        )
        if token is not None:
            _mark_used(token)
        return token

    def _still_valid_many(self, tokens: list[NodeToken]) -> set[int]:
        """Not revoked, and their nodes have the names and clusters they had: one small statement
        per RECHECK_CHUNK tokens, no query compiled."""
        valid = set()
        for start in range(0, len(tokens), RECHECK_CHUNK):
            chunk = {t.pk: t for t in tokens[start : start + RECHECK_CHUNK]}
            with connection.cursor() as cursor:
                cursor.execute(_still_valid_sql(len(chunk)), list(chunk))
                rows = cursor.fetchall()
            for pk, revoked_at, name, cluster_id in rows:
                token = chunk[pk]
                if revoked_at is None and (name, cluster_id) == (token.node.name, token.node.cluster_id):
                    valid.add(pk)
        return valid

    def _used(self, token: NodeToken) -> None:
        _mark_used(token)


# Tokens re-checked by one statement (well under SQLite's limit of bound parameters).
RECHECK_CHUNK = 500


@functools.lru_cache(maxsize=8)
def _still_valid_sql(count: int) -> str:
    """`_still_valid_many`'s statement for `count` tokens."""
    qn = connection.ops.quote_name
    t, n = NodeToken._meta.db_table, Node._meta.db_table
    marks = ", ".join(["%s"] * count)
    return (
        f"SELECT t.{qn('id')}, t.{qn('revoked_at')}, n.{qn('name')}, n.{qn('cluster_id')} FROM {qn(t)} t"
        f" JOIN {qn(n)} n ON n.{qn('id')} = t.{qn('node_id')} WHERE t.{qn('id')} IN ({marks})"
    )


def _mark_used(token: NodeToken) -> None:
    """Record that `token` was used now (at most every NODE_LAST_USED_S)."""
    wall = timezone.now()
    if token.last_used is None or (wall - token.last_used).total_seconds() >= NODE_LAST_USED_S:
        NodeToken.objects.filter(pk=token.pk).update(last_used=wall)
        token.last_used = wall


def node_tokens_forget() -> None:
    """Drop every remembered node token (after a revocation)."""
    NodeAuthentication.cache.clear()


# Every API view authenticates with these, in this order (the project's default names the same).
AUTHENTICATION = [TokenAuthentication, SessionAuthentication, LauncherAuthentication]


class NodeAuthenticationScheme(KeyAuthenticationScheme):
    target_class = NodeAuthentication
    name = "nodeAuth"
    description = "Per-node agent token: `Node <key>` (manage.py create_node_token)"


class LauncherAuthenticationScheme(KeyAuthenticationScheme):
    target_class = LauncherAuthentication
    name = "launcherAuth"
    description = "Per-cluster launcher token: `Launcher <key>` (manage.py create_launcher_token)"

"""Request throttles keyed by who is calling: a launcher by its token, a user by their id, an
anonymous client by the socket's address (X-Forwarded-For only through TOPOWEB_NUM_PROXIES
trusted proxies, so a spoofed header buys no fresh budget).

Each throttle counts requests in fixed windows of its rate's period (a minute for "120/min"): one
cache `incr` per scope and request, whatever the rate, where DRF's SimpleRateThrottle reads and
rewrites the list of every request's time in the last period (thousands of entries at 1,000 a
minute). A caller gets the rate's number of requests per window, and a refused one waits until the
window ends (`Retry-After`). Across a window's edge a caller may get up to twice the rate in one
period."""

from __future__ import annotations

from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from .authentication import launcher_of, node_token_of


def caller_key(request, view) -> str:
    """ "launcher:<token id>", "user:<id>" or "ip:<address>"."""
    token = launcher_of(request)
    if token is not None:
        return f"launcher:{token.pk}"
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return f"ip:{BaseThrottle().get_ident(request)}"


class FixedWindowThrottle(SimpleRateThrottle):
    """SimpleRateThrottle (its rates, scopes, cache keys and `THROTTLE_RATES`) counting requests in
    fixed windows: the window's counter is created with `add` (expiring with the window) and
    counted with `incr`. Refused requests count too, which changes nothing: past the rate, a
    window refuses every request until it ends."""

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        return self._count(key) <= self.num_requests

    def _count(self, key: str) -> int:
        """This request's number in the current window of `key`."""
        self.now = self.timer()
        window = int(self.now // self.duration)
        self.window_end = (window + 1) * self.duration
        self.key = f"{key}_{window}"
        try:
            return self.cache.incr(self.key)
        except ValueError:  # the window's first request
            pass
        if self.cache.add(self.key, 1, self.duration):
            return 1
        try:  # another process created it in between
            return self.cache.incr(self.key)
        except ValueError:  # and it expired in between: the window is over
            return 1

    def wait(self):
        """Seconds until the current window ends and the caller's count starts again."""
        return max(self.window_end - self.now, 0.0)


class CallerRateThrottle(FixedWindowThrottle):
    """Every API request, per caller: scope "launcher" for launcher tokens, "user" otherwise."""

    def get_rate(self):
        # The rate depends on the caller; allow_request picks it.
        return None

    def allow_request(self, request, view):
        self.scope = "launcher" if launcher_of(request) is not None else "user"
        self.rate = self.THROTTLE_RATES.get(self.scope)
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": caller_key(request, view)}


class ScopedCallerThrottle(CallerRateThrottle):
    """The view's `throttle_scope` (e.g. "submit"), per caller, on top of CallerRateThrottle.

    Operators and admins past the users' "submit" rate go on under their own, higher
    "submit_operator" rate: their role is only read then, so an ordinary submission costs no
    permission query."""

    def allow_request(self, request, view):
        self.scope = getattr(view, "throttle_scope", None) or ""
        self.rate = self.THROTTLE_RATES.get(self.scope) if self.scope else None
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        if FixedWindowThrottle.allow_request(self, request, view):
            return True
        higher = self.THROTTLE_RATES.get(f"{self.scope}_operator")
        if higher is None or not _operates(request):
            return False
        self.scope, self.rate = f"{self.scope}_operator", higher
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return FixedWindowThrottle.allow_request(self, request, view)


def _operates(request) -> bool:
    from .roles import MANAGE_JOBS

    user = getattr(request, "user", None)
    return bool(
        user is not None and user.is_authenticated and (user.is_superuser or user.has_perm(MANAGE_JOBS))
    )


class NodeSyncThrottle(FixedWindowThrottle):
    """Agent syncs per node (scope "agent_sync", keyed by the node token's node): a storm of
    syncs or reports from one node is refused with 429 for that node alone, and its agent keeps
    the reports and retries them after its back-off."""

    scope = "agent_sync"

    def get_cache_key(self, request, view):
        token = node_token_of(request)
        if token is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"node:{token.node_id}"}

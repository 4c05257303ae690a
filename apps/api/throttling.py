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
        key = self.window_key(request, view)
        return key is None or self.allows(request, view, self._count(key, windowed=True))

    def window_key(self, request, view) -> str | None:
        """The cache key of this request's counter in the current window; None when no rate
        applies (the request is allowed uncounted). `allows` takes the counter's new value."""
        if self.rate is None:
            return None
        key = self.get_cache_key(request, view)
        return None if key is None else self._window(key)

    def allows(self, request, view, count: int) -> bool:
        """Whether the request, number `count` in its window, is allowed."""
        return count <= self.num_requests

    def _window(self, key: str) -> str:
        self.now = self.timer()
        window = int(self.now // self.duration)
        self.window_end = (window + 1) * self.duration
        self.key = f"{key}_{window}"
        return self.key

    def _count(self, key: str, *, windowed: bool = False) -> int:
        """This request's number in the current window of `key` (`windowed`: `key` is the
        window's key already)."""
        if not windowed:
            self._window(key)
        counting = getattr(self.cache, "count_windows", None)
        if counting is not None:  # Redis: one round trip
            return counting([(self.key, self.duration)])[0]
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

    def window_key(self, request, view) -> str | None:
        self.scope = "launcher" if launcher_of(request) is not None else "user"
        self.rate = self.THROTTLE_RATES.get(self.scope)
        if self.rate is None:
            return None
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().window_key(request, view)

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": caller_key(request, view)}


class ScopedCallerThrottle(CallerRateThrottle):
    """The view's `throttle_scope` (e.g. "submit"), per caller, on top of CallerRateThrottle.

    Operators and admins past the users' "submit" rate go on under their own, higher
    "submit_operator" rate: their role is only read then, so an ordinary submission costs no
    permission query."""

    def window_key(self, request, view) -> str | None:
        self.scope = getattr(view, "throttle_scope", None) or ""
        self.rate = self.THROTTLE_RATES.get(self.scope) if self.scope else None
        if self.rate is None:
            return None
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return FixedWindowThrottle.window_key(self, request, view)

    def allows(self, request, view, count: int) -> bool:
        if FixedWindowThrottle.allows(self, request, view, count):
            return True
        higher = self.THROTTLE_RATES.get(f"{self.scope}_operator")
        if higher is None or not _operates(request):
            return False
        self.scope, self.rate = f"{self.scope}_operator", higher
        self.num_requests, self.duration = self.parse_rate(self.rate)
        key = FixedWindowThrottle.window_key(self, request, view)
        return key is None or FixedWindowThrottle.allows(self, request, view, self._count(key, windowed=True))


class CountsWindowsTogether:
    """A view mixin: its fixed-window throttles' counters are counted in one cache round trip
    (a submission's caller and "submit" counters), the others checked one by one as DRF does."""

    def check_throttles(self, request):
        waits = []
        counted = []
        for throttle in self.get_throttles():
            if not isinstance(throttle, FixedWindowThrottle):
                if not throttle.allow_request(request, self):
                    waits.append(throttle.wait())
                continue
            key = throttle.window_key(request, self)
            if key is not None:
                counted.append((throttle, key))
        counting = getattr(counted[0][0].cache, "count_windows", None) if counted else None
        if counting is not None and len(counted) > 1:
            counts = counting([(key, throttle.duration) for throttle, key in counted])
        else:
            counts = [throttle._count(key, windowed=True) for throttle, key in counted]
        for (throttle, _), count in zip(counted, counts, strict=True):
            if not throttle.allows(request, self, count):
                waits.append(throttle.wait())
        if waits:
            self.throttled(request, max((w for w in waits if w is not None), default=None))


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

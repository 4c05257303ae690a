"""What a REST submission reads about its submitter, remembered per process for RECENT_S seconds.

A burst of one user's submissions asks the same questions hundreds of times a second: their
account, the QOS they may use on the cluster, whether the cluster's executor can run their ranks
as their Unix account. Rows that change a few times a day, so an answer this process read within
RECENT_S seconds (as the cluster's row, `apps.topology.selectors.cluster_named`) serves them. A
change saved in this process forgets every answer at once (signal receivers, apps.py); other
processes' changes are seen at most RECENT_S late, and a submission refused with a remembered
answer is tried again with everything read afresh (`services.job_submit`), so a kept answer never
costs a refusal. The caps on waiting jobs are read afresh under the submitter's lock whatever is
remembered (`services._within_queued_caps`).

Only answers are kept, never a refusal: a question whose read raises is asked again next time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

RECENT_S = 1.0
MAX_KEPT = 4096

T = TypeVar("T")
_kept: dict[Hashable, tuple[float, object]] = {}
_request = threading.local()


def read(key: Hashable, fetch: Callable[[], T]) -> T:
    """The answer to `key` this process read within RECENT_S seconds, else `fetch()` (kept)."""
    now = time.monotonic()
    hit = _kept.get(key)
    if hit is not None and hit[0] > now:
        _request.used = True
        return hit[1]  # type: ignore[return-value]
    value = fetch()
    if len(_kept) >= MAX_KEPT:
        _kept.clear()
    _kept[key] = (now + RECENT_S, value)
    return value


def start() -> None:
    """Begin a submission on this thread: `used` tells whether it took a kept answer."""
    _request.used = False


def used() -> bool:
    """Whether this thread's submission since `start` took an answer read earlier."""
    return getattr(_request, "used", False)


def forget(**_signal) -> None:
    """Drop every kept answer (a signal receiver: an account, membership, QOS, user, executor or
    Unix account was saved or deleted in this process)."""
    _kept.clear()

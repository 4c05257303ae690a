"""Work a view leaves until its request's API write slot is released (topoweb.middleware's
WriteSlotsMiddleware keeps the slot and runs the work after releasing it)."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

AFTER_ATTR = "_after_write_slot"  # the HttpRequest attribute WriteSlotsMiddleware sets: a list


def after_write_slot(request, work: Callable[[], object]) -> None:
    """Run `work` once `request` (a DRF or Django request) has released its write slot, before the
    response goes out; at once when the request holds none. Work that raises is logged."""
    hooks = getattr(getattr(request, "_request", request), AFTER_ATTR, None)
    if hooks is None:
        run_logged(work)
    else:
        hooks.append(work)


def run_logged(work: Callable[[], object]) -> None:
    """Run `work`, logging (not raising) what it raises."""
    try:
        work()
    except Exception:
        log.exception("work after a write slot failed")

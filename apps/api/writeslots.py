"""The API write slot a thread holds (topoweb.middleware's WriteSlotsMiddleware takes and
releases it): work a view leaves until the slot is released, and waits that run no Python (a
COMMIT's flush to disk) during which the slot is lent to the process's next write."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

_HELD = threading.local()


def holding(slot: threading.Semaphore | None) -> None:
    """Record the slot this thread now holds (None: it holds none)."""
    _HELD.slot = slot


@contextmanager
def slot_lent() -> Iterator[None]:
    """The write slot this thread holds, released for the block and taken back (waiting for it)
    after: for a wait that runs no Python, such as a COMMIT's flush (topoweb.postgres), so the
    process's next write runs meanwhile. Writes still run their Python one at a time per slot."""
    slot = getattr(_HELD, "slot", None)
    if slot is None:
        yield
        return
    _HELD.slot = None
    slot.release()
    try:
        yield
    finally:
        slot.acquire()
        _HELD.slot = slot


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

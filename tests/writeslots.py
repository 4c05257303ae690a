"""What tests of the API write slots ask of a slot: is it free now (taken and given back at once)."""

from __future__ import annotations

import threading


def slot_free(slot: threading.Semaphore | None = None) -> bool:
    """Whether `slot` (default: this process's single API write slot) could be taken now; it is
    given back at once."""
    if slot is None:
        from topoweb.middleware import _write_slots

        slot = _write_slots(1)
    free = slot.acquire(blocking=False)
    if free:
        slot.release()
    return free

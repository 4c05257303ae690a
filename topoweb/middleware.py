"""Project-wide middleware: a 503 with Retry-After while the database cannot be reached, a limit
on the API writes one process runs at once, and the Content-Security-Policy header built once per
process."""

from __future__ import annotations

import functools
import logging
import threading

import csp.middleware
from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.utils import build_policy
from django.conf import settings
from django.core.signals import setting_changed
from django.db import InterfaceError, OperationalError
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from rest_framework.permissions import SAFE_METHODS

from apps.api.writeslots import AFTER_ATTR, holding, run_logged

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # what clients are told to wait before retrying
WRITE_RETRY_AFTER_S = 1  # the same after no API write slot came free in time


class DatabaseUnavailableMiddleware:
    """Turn a lost or refused database connection into a 503 with `Retry-After`: a JSON body
    under /api/, a plain page elsewhere. Other database errors (integrity, data) are bugs or bad
    input and are left to the usual handlers."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        log.warning("database unavailable on %s %s: %s", request.method, request.path, exception)
        return database_unavailable(request)


def retry_later(detail: str, retry_after_s: int) -> JsonResponse:
    """An API 503: `{"detail": ...}` with `Retry-After`."""
    response = JsonResponse({"detail": detail}, status=503)
    response["Retry-After"] = str(retry_after_s)
    return response


def database_unavailable(request: HttpRequest) -> HttpResponse:
    """The 503 answered while the database is unreachable."""
    if request.path.startswith("/api/"):
        return retry_later(
            "The database is unavailable; retry after the time in Retry-After (seconds).", RETRY_AFTER_S
        )
    # No request context: its processors may touch the database that just failed.
    response = HttpResponse(render_to_string("503.html", {"retry_after_s": RETRY_AFTER_S}), status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class WriteSlotsMiddleware:
    """At most `API_WRITE_SLOTS` API writes run at once in this process; the others wait up to
    `API_WRITE_WAIT_S` for a slot, then get a 503 with Retry-After.

    A write (a submission's validation and INSERT, a placement preview's solver) is CPU work from
    start to end. Run by every thread of a web process at once, writes share one interpreter lock
    and leave a reader waiting its turn behind each of them at every step (each query and cache
    call gives the lock up): during a burst of submissions a job list took several times its own
    CPU time. With one write at a time per process, readers wait for at most one, and the writes
    lose nothing, since one process runs only one thread of Python at a time anyway (docs/
    performance.md has the A/B). Writes are POST, PUT, PATCH and DELETE to the REST API's views,
    but those whose class sets `write_slot = False` (the node agents' sync, a long-poll that
    would hold the slot while it waits). The body is read before the wait, so a client that sends
    its body slowly holds no slot while doing so. Work a view hands to `after_write_slot` runs
    once the slot is released; a COMMIT waiting for its flush lends the slot to the next write
    (`slot_lent`, topoweb.postgres)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            return self.get_response(request)
        finally:
            held = request.__dict__.pop("_write_slot", None)
            if held is not None:
                holding(None)
                held.release()
            # What the view left until the slot is free (`apps.api.writeslots.after_write_slot`:
            # a submission's cycle request, a round trip to the broker's cache).
            for work in request.__dict__.pop(AFTER_ATTR, ()):
                run_logged(work)

    def process_view(self, request: HttpRequest, view_func, view_args, view_kwargs) -> HttpResponse | None:
        cls = getattr(view_func, "cls", None)
        if request.method in SAFE_METHODS or cls is None or not getattr(cls, "write_slot", True):
            return None
        slots = _write_slots(settings.API_WRITE_SLOTS)
        if slots is None:
            return None
        request.body  # noqa: B018 (read the body now, bounded by topoweb.bodylimits, not in the slot)
        wait_s = settings.API_WRITE_WAIT_S
        if not slots.acquire(timeout=wait_s):
            log.warning(
                "no write slot within %.1f s for %s %s: answered 503", wait_s, request.method, request.path
            )
            return retry_later(
                f"The server is busy: {settings.API_WRITE_SLOTS} API write(s) at once per web process"
                f" (TOPOWEB_API_WRITE_SLOTS) were running for the {wait_s:g} s this request waited;"
                " retry after the time in Retry-After (seconds).",
                WRITE_RETRY_AFTER_S,
            )
        request._write_slot = slots
        holding(slots)
        setattr(request, AFTER_ATTR, [])
        return None


@functools.cache
def _write_slots(slots: int) -> threading.BoundedSemaphore | None:
    """This process's write slots for a setting of `slots` (None: no limit)."""
    return threading.BoundedSemaphore(slots) if slots > 0 else None


@functools.cache
def _csp_policies() -> tuple[str, str]:
    """The settings' Content-Security-Policy and report-only policy as header values (cached
    until a CONTENT_SECURITY_POLICY setting changes)."""
    return build_policy(), build_policy(report_only=True)


@receiver(setting_changed)
def _csp_settings_changed(*, setting, **kwargs) -> None:
    if setting.startswith("CONTENT_SECURITY_POLICY"):
        _csp_policies.cache_clear()


# What a view (django-csp's decorators) or a template (a nonce) may set to change one answer's policy.
_CSP_PER_RESPONSE = (
    "_csp_config",
    "_csp_update",
    "_csp_replace",
    "_csp_config_ro",
    "_csp_update_ro",
    "_csp_replace_ro",
)


class CSPMiddleware(csp.middleware.CSPMiddleware):
    """django-csp's middleware, with the settings' policy built once per process: django-csp
    builds both headers from the settings for every answer, a tenth of a job list's CPU. An answer
    whose view or template changed its policy (decorators, a nonce) takes django-csp's own path."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if getattr(request, "_csp_nonce", None) is not None or any(
            getattr(response, name, None) is not None for name in _CSP_PER_RESPONSE
        ):
            return super().process_response(request, response)
        if response.status_code in (500, 404) and settings.DEBUG:
            return response
        policy, report_only = _csp_policies()
        for header, value, exempt, setting in (
            (HEADER, policy, "_csp_exempt", "CONTENT_SECURITY_POLICY"),
            (HEADER_REPORT_ONLY, report_only, "_csp_exempt_ro", "CONTENT_SECURITY_POLICY_REPORT_ONLY"),
        ):
            if not value or header in response or getattr(response, exempt, False):
                continue
            prefixes = (getattr(settings, setting, None) or {}).get("EXCLUDE_URL_PREFIXES") or ()
            if not request.path_info.startswith(tuple(prefixes)):
                response[header] = value
        # As django-csp: a nonce asked for after the header was written is an error, not a silent gap.
        request.csp_nonce = csp.middleware.CheckableLazyObject(self._csp_nonce_post_response)
        return response

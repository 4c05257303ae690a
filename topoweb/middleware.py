"""Project-wide middleware: a 503 with Retry-After while the database cannot be reached."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # what clients are told to wait before retrying


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


def database_unavailable(request: HttpRequest) -> HttpResponse:
    """The 503 answered while the database is unreachable."""
    if request.path.startswith("/api/"):
        response = JsonResponse(
            {"detail": "The database is unavailable; retry after the time in Retry-After (seconds)."},
            status=503,
        )
    else:
        # No request context: its processors may touch the database that just failed.
        response = HttpResponse(render_to_string("503.html", {"retry_after_s": RETRY_AFTER_S}), status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response

"""Checks on every request's URL before any view reads it."""

from __future__ import annotations

from django.http import HttpResponseBadRequest, JsonResponse


def reject_nul_bytes(get_response):
    """A 400 for a NUL byte in the path or in a query parameter: no name, id or filter holds one,
    and Postgres refuses them in queries (a 500 otherwise). API paths answer JSON naming the
    parameter."""

    def middleware(request):
        bad = None
        if "\x00" in request.path:
            bad = "path"
        else:
            bad = next(
                (
                    key or "query"
                    for key, values in request.GET.lists()
                    if "\x00" in key or any("\x00" in v for v in values)
                ),
                None,
            )
        if bad is None:
            return get_response(request)
        message = "must not contain NUL bytes"
        if request.path.startswith("/api/"):
            return JsonResponse({bad.replace("\x00", "\\x00")[:40]: [message]}, status=400)
        return HttpResponseBadRequest(f"{bad}: {message}", content_type="text/plain")

    return middleware

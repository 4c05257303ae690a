"""Request body limits per endpoint, enforced before anything reads the body.

One table (`BODY_LIMITS`, documented in docs/spec-limits.md): the first pattern matching the path
gives the limit in bytes. A request whose Content-Length is over it (or not a number) is answered
413 (400 for a malformed length) naming the limit, before sessions, CSRF, parsers or views run.
Django reads no more than Content-Length from the request stream, so the header is the size that
counts; a chunked body without one would read as empty, and is answered 411 (Length Required)
instead of as a request without a body. The spec loaders check the size again on
the text they parse (`apps.placement.topology.safeload`).
"""

from __future__ import annotations

import re

from django.http import HttpResponse, JsonResponse

from apps.placement.topology import JOB_LIMITS, TOPOLOGY_LIMITS

KiB = 1024
MiB = 1024 * KiB

BODY_LIMITS: tuple[tuple[re.Pattern, int], ...] = (
    # Topology spec v1 imports (JSON/YAML body or multipart file) and the import page.
    (re.compile(r"^/api/v1/clusters/(import/)?$"), TOPOLOGY_LIMITS.max_bytes + 64 * KiB),
    (re.compile(r"^/import/$"), TOPOLOGY_LIMITS.max_bytes + 64 * KiB),
    # Job spec v1: submission (one spec within JOB_LIMITS, checked by its parser, or a bulk list
    # of them) and placement preview.
    (re.compile(r"^/api/v1/jobs/$"), 4 * MiB),
    (re.compile(r"^/api/v1/placements/preview/$"), JOB_LIMITS.max_bytes),
    # Node agents' syncs: up to 256 rank reports, each with the tail of the rank's output.
    (re.compile(r"^/api/v1/agents/sync/$"), 4 * MiB),
    # The admin topology editor posts whole inline formsets.
    (re.compile(r"^/admin/"), 10 * MiB),
    # Everything else (job actions, cluster settings, launcher reports, login): small bodies.
    (re.compile(r""), 256 * KiB),
)


def body_limit(path: str) -> int:
    """The largest request body, in bytes, accepted on `path`."""
    for pattern, limit in BODY_LIMITS:
        if pattern.match(path):
            return limit
    raise AssertionError("BODY_LIMITS ends with a catch-all pattern")


def _answer(request, status: int, message: str, limit: int) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": message, "limit_bytes": limit}, status=status)
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")


class BodyLimitMiddleware:
    """Refuse request bodies over their endpoint's limit (413) before anything reads them."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        raw = request.META.get("CONTENT_LENGTH") or "0"
        limit = body_limit(request.path)
        if raw == "0" and "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            return _answer(request, 411, "send the body with a Content-Length, not chunked", limit)
        if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
            return _answer(request, 400, f"Content-Length must be a byte count, got {raw[:20]!r}", limit)
        size = int(raw)
        if size > limit:
            return _answer(
                request,
                413,
                f"the request body is {size} bytes; the limit for this endpoint is {limit} bytes",
                limit,
            )
        return self.get_response(request)

"""Error pages of the API's URL space: JSON bodies, as every API view answers."""

from __future__ import annotations

from django.http import JsonResponse
from django.views import defaults


def not_found(request, exception=None):
    """404 for URLs no route matches: `{"detail": ...}` JSON under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)

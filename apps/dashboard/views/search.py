"""`/search/`: the header's search box, as JSON for its suggestions and as a page without scripts."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from apps.dashboard.search import QUERY_MAX_CHARS, exact_target, search


@login_required
@require_GET
def search_page(request):
    """`?q=TEXT` (at most QUERY_MAX_CHARS characters): a job id or name, node, switch, cluster or
    user. An exact match redirects to its page; `?format=json` answers `{"query", "results",
    "exact"}` instead, for the suggestions under the box."""
    query = request.GET.get("q", "")
    as_json = request.GET.get("format") == "json"
    if len(query) > QUERY_MAX_CHARS:
        message = f"at most {QUERY_MAX_CHARS} characters"
        if as_json:
            return JsonResponse({"q": [message]}, status=400)
        return render(request, "dashboard/search.html", {"query": "", "error": f"q: {message}"}, status=400)
    hits = search(user=request.user, query=query)
    target = exact_target(hits)
    if as_json:
        return JsonResponse({"query": query.strip(), "results": [h.as_dict() for h in hits], "exact": target})
    if target is not None and request.GET.get("list") != "1":
        return redirect(target)
    return render(request, "dashboard/search.html", {"query": query.strip(), "hits": hits})

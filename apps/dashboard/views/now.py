"""The operators' landing page: what is broken right now, refreshed in place."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from apps.api import roles
from apps.dashboard.now import now_overview

from .common import refresh_s

REFRESH_S = 15


@login_required
@require_GET
def now_page(request):
    """`/now/`: nodes down or drained, unhealthy GPUs, jobs failed in the last hour, hotspots and
    proposals, agents and metrics behind, queue pressure; `?fragment=1` returns the body alone
    (the page's script fetches it every REFRESH_S seconds, or `?refresh=S`, 2..300)."""
    context = {
        **now_overview(user=request.user),
        "refresh_s": refresh_s(request.GET.get("refresh"), REFRESH_S),
    }
    if request.GET.get("fragment"):
        return render(request, "dashboard/_now_body.html", context)
    return render(request, "dashboard/now.html", context)


@login_required
@require_GET
def landing(request):
    """Where signing in leads: operators (who may drain nodes) to the now page, others to the
    cluster graph."""
    if roles.can(request.user, roles.MANAGE_NODES):
        return redirect("dashboard:now")
    return redirect("dashboard:home")

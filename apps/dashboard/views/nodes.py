"""Node health on the cluster page: drain and resume from the dashboard (operators)."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from apps.api import roles
from apps.scheduling.agents import node_drain, node_resume
from apps.topology.models import Node

from .common import perm_required

REASON_MAX_CHARS = 500


@perm_required(roles.MANAGE_NODES)
@require_POST
def node_health_decide(request, name: str, action: str):
    """POST from the cluster page (fields `node`, and `reason` to drain): drain or resume a node."""
    target = get_object_or_404(Node, cluster__name=name, name=request.POST.get("node", "")[:200])
    if action == "drain":
        reason = request.POST.get("reason", "").strip()
        if not reason or len(reason) > REASON_MAX_CHARS:
            messages.error(request, f"reason: required, at most {REASON_MAX_CHARS} characters")
            return redirect("dashboard:cluster", name=name)
        agent = node_drain(node=target, reason=reason)
        messages.success(request, f"Node {target.name} is {agent.state}: {reason}")
    else:
        node_resume(node=target)
        messages.success(request, f"Node {target.name} is back in service.")
    return redirect("dashboard:cluster", name=name)

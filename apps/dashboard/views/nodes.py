"""The node and switch pages, and drain and resume from the dashboard (operators)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from apps.api import roles
from apps.dashboard.selectors import node_overview, switch_overview
from apps.scheduling.agent_selectors import cluster_health, node_rows
from apps.scheduling.agents import node_drain, node_resume
from apps.scheduling.choices import NODE_STATE_FILTERS
from apps.topology.models import Cluster, Node, Switch

from .common import perm_required

REASON_MAX_CHARS = 500
NAME_MAX_CHARS = 200


@login_required
@require_GET
def node_page(request, name: str, node: str):
    """`/clusters/NAME/nodes/NODE/`: the node's GPUs, NICs, leaves, jobs, health and metrics."""
    target = get_object_or_404(
        Node.objects.select_related("cluster", "leaf", "gpu_model"), cluster__name=name, name=node
    )
    context = {"cluster": target.cluster, "node": target, **node_overview(node=target, user=request.user)}
    return render(request, "dashboard/node.html", context)


@login_required
@require_GET
def node_list(request, name: str):
    """`/clusters/NAME/nodes/?state=S`: every node as `sinfo -N` lists it, with its state, reason,
    since when and last heartbeat; `state` one of NODE_STATE_FILTERS (400 naming it otherwise)."""
    cluster = get_object_or_404(Cluster, name=name)
    state = request.GET.get("state", "")
    error = ""
    if state and state not in NODE_STATE_FILTERS:
        error = f"state: one of {', '.join(NODE_STATE_FILTERS)}"
        state = ""
    rows = [] if error else node_rows(cluster_id=cluster.pk, state=state)
    health = cluster_health(cluster_id=cluster.pk)
    context = {
        "cluster": cluster,
        "rows": rows,
        "state": state,
        "error": error,
        "health": health,
        "filters": [(s, health["counts"].get(s, len(health["unhealthy_nodes"]))) for s in NODE_STATE_FILTERS],
    }
    return render(request, "dashboard/nodes.html", context, status=400 if error else 200)


@login_required
@require_GET
def switch_page(request, name: str, switch: str):
    """`/clusters/NAME/switches/SWITCH/`: the switch's tier, links and the nodes cabled to it."""
    target = get_object_or_404(Switch.objects.select_related("cluster"), cluster__name=name, name=switch)
    context = {"cluster": target.cluster, "switch": target, **switch_overview(switch=target)}
    return render(request, "dashboard/switch.html", context)


def _back(request, name: str, node: Node | None):
    # The node page's forms ask to come back to it; the cluster page's go back there.
    if node is not None and request.POST.get("back") == "node":
        return redirect("dashboard:node", name=name, node=node.name)
    return redirect("dashboard:cluster", name=name)


@perm_required(roles.MANAGE_NODES)
@require_POST
def node_health_decide(request, name: str, action: str):
    """POST from the cluster or node page (fields `node`, and `reason` to drain; `back=node` to
    return to the node page): drain or resume a node."""
    target = get_object_or_404(Node, cluster__name=name, name=request.POST.get("node", "")[:NAME_MAX_CHARS])
    if action == "drain":
        reason = request.POST.get("reason", "").strip()
        if not reason or len(reason) > REASON_MAX_CHARS:
            messages.error(request, f"reason: required, at most {REASON_MAX_CHARS} characters")
            return _back(request, name, target)
        agent = node_drain(node=target, reason=reason)
        messages.success(request, f"Node {target.name} is {agent.state}: {reason}")
    else:
        node_resume(node=target)
        messages.success(request, f"Node {target.name} is back in service.")
    return _back(request, name, target)

"""The node and switch pages, and drain and resume from the dashboard (operators)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from apps.api import roles
from apps.dashboard.hotlinks import MAX_LIMIT, SORTS, hot_links, leaf_history, oversubscription
from apps.dashboard.selectors import node_overview, switch_overview
from apps.scheduling.choices import NODE_STATE_FILTERS
from apps.scheduling.executor import Refused
from apps.scheduling.nodes import cluster_health, node_drain, node_list_q, node_resume, node_rows
from apps.topology.models import Cluster, Node, Switch

from .common import perm_required

REASON_MAX_CHARS = 500
NAME_MAX_CHARS = 200
# The node list's page: 2,048 nodes on one page were a megabyte of HTML.
NODES_PER_PAGE = 256


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
    """`/clusters/NAME/nodes/?state=S&page=P`: every node as `sinfo -N` lists it, with its state,
    reason, since when and last heartbeat, NODES_PER_PAGE a page; `state` one of
    NODE_STATE_FILTERS and `page` within the pages (400 naming the field otherwise)."""
    cluster = get_object_or_404(Cluster, name=name)
    state = request.GET.get("state", "")
    errors = []
    if state and state not in NODE_STATE_FILTERS:
        errors.append(f"state: one of {', '.join(NODE_STATE_FILTERS)}")
        state = ""
    listed = node_list_q(cluster_id=cluster.pk, state=state).count()
    pages = max(1, -(-listed // NODES_PER_PAGE))
    page = int(_number(request.GET.get("page"), 1, 1, pages, "page", errors))
    start = (page - 1) * NODES_PER_PAGE
    rows = (
        []
        if errors
        else node_rows(cluster_id=cluster.pk, state=state, start=start, stop=start + NODES_PER_PAGE)
    )
    health = cluster_health(cluster_id=cluster.pk)
    error = "; ".join(errors)
    context = {
        "cluster": cluster,
        "rows": rows,
        "page": page,
        "pages": pages,
        "page_numbers": range(1, pages + 1),
        "listed": listed,
        "first": start + 1,
        "last": start + len(rows),
        "state": state,
        "error": error,
        "health": health,
        "filters": [(s, health["counts"].get(s, len(health["unhealthy_nodes"]))) for s in NODE_STATE_FILTERS],
    }
    return render(request, "dashboard/nodes.html", context, status=400 if error else 200)


@login_required
@require_GET
def switch_page(request, name: str, switch: str):
    """`/clusters/NAME/switches/SWITCH/`: the switch's tier, links and the nodes cabled to it, its
    oversubscription, the load on its links with the jobs crossing them, and for a leaf its
    measured uplink share over the last hours."""
    target = get_object_or_404(Switch.objects.select_related("cluster"), cluster__name=name, name=switch)
    context = {
        "cluster": target.cluster,
        "switch": target,
        **switch_overview(switch=target),
        "oversub": oversubscription(switch=target),
        "loads": hot_links(cluster=target.cluster, user=request.user, limit=64, switch=target.name),
        "history": leaf_history(cluster=target.cluster, hours=HISTORY_HOURS, leaf=target.name)
        if target.tier == "leaf"
        else [],
        "hours": HISTORY_HOURS,
    }
    return render(request, "dashboard/switch.html", context)


HISTORY_HOURS = 6.0
LINKS_LISTED = 25


@login_required
@require_GET
def links_page(request, name: str):
    """`/clusters/NAME/links/?sort=load|predicted|measured|diff&n=N&hours=H`: the N busiest links
    (default 25, at most 500) with their jobs, and each leaf's measured uplink share over the
    last H hours (default 6, at most 24). Bad parameters answer 400 naming them."""
    cluster = get_object_or_404(Cluster, name=name)
    errors = []
    sort = request.GET.get("sort", "load")
    if sort not in SORTS:
        errors.append(f"sort: one of {', '.join(SORTS)}")
        sort = "load"
    limit = _number(request.GET.get("n"), LINKS_LISTED, 1, MAX_LIMIT, "n", errors)
    hours = _number(request.GET.get("hours"), HISTORY_HOURS, 0.25, 24, "hours", errors)
    context = {
        "cluster": cluster,
        "sort": sort,
        "limit": int(limit),
        "hours": hours,
        "errors": errors,
        "sorts": SORTS,
        "history": leaf_history(cluster=cluster, hours=hours),
        **hot_links(cluster=cluster, user=request.user, limit=int(limit), sort=sort),
    }
    return render(request, "dashboard/links.html", context, status=400 if errors else 200)


def _number(raw, default: float, low: float, high: float, field: str, errors: list) -> float:
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        errors.append(f"{field}: a number from {low:g} to {high:g}")
        return default
    return value


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
        try:
            agent = node_drain(node=target, reason=reason)
        except Refused as exc:
            messages.error(request, str(exc))
            return _back(request, name, target)
        messages.success(request, f"Node {target.name} is {agent.state}: {reason}")
    else:
        try:
            node_resume(node=target)
        except Refused as exc:
            messages.error(request, str(exc))
            return _back(request, name, target)
        messages.success(request, f"Node {target.name} is back in service.")
    return _back(request, name, target)

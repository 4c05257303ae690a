"""The cluster page: the layered topology graph with its overlays, and the jobs on it."""

from __future__ import annotations

import hashlib
import re

import numpy as np
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET

from apps.dashboard.figures import AGGREGATE_ABOVE_NODES, OVERLAYS, cluster_figure
from apps.dashboard.measured import jobs_measured, overlay_values
from apps.dashboard.overview import hatch_defs, legend_rows, overview_svg
from apps.dashboard.paths import EndpointError, endpoints_path, leaf_matrix, parse_endpoint
from apps.dashboard.selectors import (
    SignatureCache,
    cluster_graph_data,
    graph_signature,
    layout_for,
    slurm_executor,
)
from apps.metrics.selectors import open_hotspots
from apps.scheduling.choices import ACTIVE_STATUSES
from apps.scheduling.nodes import cluster_health
from apps.topology.models import Cluster
from apps.topology.services import cluster_topology

from .common import script_json
from .vendor import plotly_js_url

SESSION_CLUSTER = "dashboard_cluster"
NODE_CHOICES = 4096  # node names offered as suggestions in the path form
# Rows of the placed-jobs table; past this the queue page lists them all (1,600 rows cost the
# page about a second of parsing and layout before the graph draws).
JOB_TABLE_ROWS = 100


@login_required
@require_GET
def cluster_pick(request):
    """The picker's target: /clusters/?name=NAME goes to that cluster's page."""
    name = request.GET.get("name", "")
    if not name:
        return redirect("dashboard:home")
    cluster = get_object_or_404(Cluster, name=name)
    return redirect("dashboard:cluster", name=cluster.name)


# One end of a linked path (`node` or `node:gpu`); anything else leaves the form empty.
PATH_END = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}(:[0-9]{1,3})?$")


@login_required
@require_GET
def cluster_page(request, name: str | None = None):
    """`/` (the last cluster picked, else the one with most placed jobs) and `/clusters/NAME/`."""
    if name is None:
        cluster = Cluster.objects.filter(name=request.session.get(SESSION_CLUSTER, "")).first()
        # Otherwise the busiest cluster, so the demo opens on its placed jobs.
        cluster = cluster or (
            Cluster.objects.annotate(active=Count("jobs", filter=Q(jobs__status__in=ACTIVE_STATUSES)))
            .order_by("-active", "name")
            .first()
        )
        if cluster is None:
            return render(request, "dashboard/no_clusters.html", status=200)
    else:
        cluster = get_object_or_404(Cluster, name=name)
    request.session[SESSION_CLUSTER] = cluster.name
    context = graph_context(cluster, request.user)
    context["cluster"] = cluster
    context["version"] = graph_version(cluster, request.user)
    # Measured values change every collection: added per request, outside the cached graph.
    measured = jobs_measured(cluster=cluster)
    context["job_rows"] = [
        {**row, "measured": measured.get(row["view"].id)} for row in context["jobs"][:JOB_TABLE_ROWS]
    ]
    context["active_statuses"] = ACTIVE_STATUSES
    context["hotspots"] = list(open_hotspots(cluster=cluster))
    context["health"] = cluster_health(cluster_id=cluster.pk)
    context["slurm"] = slurm_executor(cluster=cluster)
    # A link to a path (the job page's): the form's two ends, shown at once by the page's script.
    for end in ("a", "b"):
        raw = request.GET.get(f"path_{end}", "")
        context[f"path_{end}"] = raw if PATH_END.match(raw) else ""
    return render(request, "dashboard/cluster.html", context)


@login_required
@require_GET
def cluster_measured(request, name: str):
    """`/clusters/NAME/measured/`: measured overlay values per busy GPU and their age, polled by
    the page (the predicted values come with the graph)."""
    cluster = get_object_or_404(Cluster, name=name)
    return JsonResponse(overlay_values(cluster=cluster, topology=cluster_topology(cluster=cluster)))


@login_required
@require_GET
def cluster_path(request, name: str):
    """`/clusters/NAME/path/?a=NODE[:GPU]&b=NODE[:GPU]`: the route between two GPUs or nodes hop
    by hop (bandwidth, latency, bottleneck) as JSON; 400 naming the parameter when one is wrong."""
    cluster = get_object_or_404(Cluster, name=name)
    lay = layout_for(cluster_topology(cluster=cluster))
    try:
        a = parse_endpoint(lay.topology, "a", request.GET.get("a", ""))
        b = parse_endpoint(lay.topology, "b", request.GET.get("b", ""))
    except EndpointError as e:
        return JsonResponse({e.field: [str(e)]}, status=400)
    return JsonResponse(endpoints_path(lay, a, b))


@login_required
@require_GET
def cluster_leaf_matrix(request, name: str):
    """`/clusters/NAME/leaf-matrix/?leaf=LEAF`: node-pair bandwidth and latency under one leaf."""
    cluster = get_object_or_404(Cluster, name=name)
    lay = layout_for(cluster_topology(cluster=cluster))
    leaf = request.GET.get("leaf", "")[:200]
    if leaf not in lay.topology.leaf_by_name:
        return JsonResponse({"leaf": [f"no leaf switch named {leaf[:60]!r} in this cluster"]}, status=400)
    return JsonResponse(leaf_matrix(lay, leaf))


def graph_version(cluster: Cluster, user) -> str:
    """A short digest of the cluster graph's state as `user` sees it."""
    return hashlib.sha1(repr(graph_signature(cluster=cluster, user=user)).encode()).hexdigest()[:16]


@login_required
@require_GET
def cluster_version(request, name: str):
    """`/clusters/NAME/version/`: the graph's digest, polled by the page to offer a reload when
    jobs start, end or move."""
    cluster = get_object_or_404(Cluster, name=name)
    return JsonResponse({"cluster": cluster.name, "version": graph_version(cluster, request.user)})


_GRAPHS = SignatureCache(16)


def graph_context(cluster: Cluster, user) -> dict:
    """The cluster page's graph, job table and summary, rebuilt only when `graph_signature`
    changes (the figure of a 16k-GPU cluster takes about a second to build and encode)."""
    key = graph_signature(cluster=cluster, user=user)
    hit = _GRAPHS.get(key)
    if hit is not None:
        return dict(hit)
    data = cluster_graph_data(cluster=cluster, user=user, signature=key)
    fig = cluster_figure(data.layout, data.jobs, data.node_states, data.snapshot.stopping)
    topo = data.snapshot.topology
    tiers = [s.tier for s in topo.switches]
    context = {
        "summary": {
            "nodes": len(topo.nodes),
            "gpus": topo.n_gpus,
            "free": int(np.count_nonzero(data.snapshot.free)),
            "leaves": tiers.count("leaf"),
            "spines": tiers.count("spine"),
            "cores": tiers.count("core"),
            "running": len(data.jobs),
            "queued": data.queued,
            "rail_optimized": data.layout.rail_optimized,
        },
        "jobs": [{"view": job, "color": fig.job_color(j), "index": j} for j, job in enumerate(data.jobs)],
        "overlays": OVERLAYS,
        "aggregate_above": AGGREGATE_ABOVE_NODES,
        "leaves": list(topo.leaf_names),
        "node_names": [n.name for n in topo.nodes[:NODE_CHOICES]],
        "payload": script_json({"figure": fig.figure, "client": fig.client}),
        "plotly_js_url": plotly_js_url("basic"),
        # Painted with the page, before the plotting library loads; the graph replaces it.
        "overview": mark_safe(overview_svg(fig.client) + hatch_defs()),
        "legend": legend_rows(fig.client),
    }
    _GRAPHS.put(key, context)
    return dict(context)

"""The topology import page (topology.add_cluster): validate a spec (or convert another tool's
file), show errors per field or file line, preview, import."""

from __future__ import annotations

from collections import Counter

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render

from apps.api import roles
from apps.dashboard.figures import cluster_figure
from apps.dashboard.forms import TopologyImportForm
from apps.dashboard.layout import cluster_layout
from apps.placement.convert import Source
from apps.placement.topology import SpecError, load_topology, parse_spec_text
from apps.topology.conversion import defaults_from_text, spec_from_format
from apps.topology.models import Cluster, ClusterImport
from apps.topology.services import cluster_import, cluster_import_queue

from .common import perm_required, script_json
from .vendor import plotly_js_url

PREVIEW_MAX_GPUS = 20_000
# Larger clusters are written by a background task (the web request would outlast its time limit).
BACKGROUND_GPUS = 16_384
BACKGROUND_LISTED = 10


@perm_required(roles.IMPORT_CLUSTERS)
def topology_import(request):
    """GET: the empty form. POST `action=preview`: validate and draw the graph; `action=import`:
    validate again and write the cluster (with `replace` to overwrite one of the same name)."""
    form = TopologyImportForm(request.POST or None, request.FILES or None)
    context: dict = {
        "form": form,
        "plotly_js_url": plotly_js_url("basic"),
        "background": list(ClusterImport.objects.select_related("cluster").defer("spec")[:BACKGROUND_LISTED]),
    }
    if request.method != "POST" or not form.is_valid():
        return render(
            request, "dashboard/import.html", context, status=400 if request.method == "POST" else 200
        )
    text = form.cleaned_data["text"]
    replace = form.cleaned_data["replace"]
    fmt = form.cleaned_data["format"] or "topology-v1"
    defaults = form.cleaned_data["defaults"]
    source_name = form.cleaned_data["source_name"] or "pasted"
    action = request.POST.get("action", "preview")
    if replace and action == "import" and not roles.can(request.user, roles.CHANGE_CLUSTERS):
        raise PermissionDenied(f"replacing a cluster's topology needs the {roles.CHANGE_CLUSTERS} permission")
    notes: list[str] = []
    try:
        if fmt == "topology-v1" and not defaults.strip():
            data = parse_spec_text(text)
        else:
            data, notes = spec_from_format(
                fmt=fmt, sources=[Source(source_name, text)], defaults=defaults_from_text(defaults)
            )
        topo = load_topology(data)
        if action == "import" and topo.n_gpus > BACKGROUND_GPUS:
            queued = cluster_import_queue(data=data, replace=replace, user=request.user, notes=notes)
            messages.success(
                request,
                f"Import {queued.pk} of cluster {topo.name} ({topo.n_gpus} GPUs) runs in the background;"
                " its progress is listed below.",
            )
            return redirect("dashboard:import")
        if action == "import":
            cluster = cluster_import(data=data, replace=replace)
            messages.success(
                request, f"Imported cluster {cluster.name}: {len(topo.nodes)} nodes, {topo.n_gpus} GPUs."
            )
            return redirect("dashboard:cluster", name=cluster.name)
    except SpecError as exc:
        context.update(errors=sorted(exc.as_dict().items()), text=text)
        return render(request, "dashboard/import.html", context, status=400)
    # A valid preview: keep the text so the import button posts exactly what was checked.
    form = TopologyImportForm(
        initial={
            "text": text,
            "replace": replace,
            "format": fmt,
            "defaults": defaults,
            "source_name": source_name,
        }
    )
    tiers = [s.tier for s in topo.switches]
    context.update(
        form=form,
        text=text,
        valid=True,
        notes=notes,
        exists=Cluster.objects.filter(name=topo.name).exists(),
        summary={
            "name": topo.name,
            "nodes": len(topo.nodes),
            "gpus": topo.n_gpus,
            "leaves": tiers.count("leaf"),
            "spines": tiers.count("spine"),
            "cores": tiers.count("core"),
            "domains": len(topo.domains),
            "shapes": _shapes(topo),
        },
    )
    if topo.n_gpus <= PREVIEW_MAX_GPUS:
        fig = cluster_figure(cluster_layout(topo), [])
        context["payload"] = script_json({"figure": fig.figure, "client": fig.client})
    return render(request, "dashboard/import.html", context)


def _shapes(topo) -> str:
    """What decides placements at a glance: GPUs per node and NVLink domain sizes, with counts
    ("8 GPUs × 36 nodes; NVLink domains: 2 × 72 GPUs")."""
    per_node = Counter(n.gpus for n in topo.nodes)
    sizes = Counter(int(k) for k in Counter(topo.gpu_domain.tolist()).values())
    nodes = ", ".join(f"{g} GPUs × {k} node{'s' if k != 1 else ''}" for g, k in sorted(per_node.items()))
    domains = ", ".join(f"{k} × {g} GPUs" for g, k in sorted(sizes.items(), reverse=True))
    return f"{nodes}; NVLink domains: {domains}"

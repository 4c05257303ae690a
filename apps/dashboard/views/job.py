"""The job page: rank grid, groups, predicted vs measured, what-if by policy, migrations."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from apps.api import roles
from apps.dashboard.charts import UTIL_COLOR, timeline_figure, whatif_figure
from apps.dashboard.jobview import job_view
from apps.dashboard.measured import job_series_points
from apps.dashboard.selectors import (
    SignatureCache,
    cluster_graph_data,
    graph_signature,
    job_label,
    job_proposals,
    visible_jobs,
)
from apps.dashboard.whatif import what_if
from apps.metrics import selectors as metrics
from apps.placement.bounds import lower_bound
from apps.placement.jobs import load_job
from apps.placement.topology import SpecError
from apps.scheduling import services
from apps.scheduling.accounts import job_priority
from apps.scheduling.accounts import weights as priority_weights
from apps.scheduling.choices import ACTIVE_STATUSES, FINISHED_STATUSES, WAITING_STATUSES, ProposalStatus
from apps.scheduling.models import MigrationProposal
from apps.scheduling.proposals import ProposalStateError
from apps.scheduling.rankmaps import USAGE as RANKMAP_USAGE
from apps.scheduling.rankmaps import nodes_in_rank_order
from apps.scheduling.selectors import coordinates, job_generations, job_rank_logs, job_ranks
from apps.scheduling.services import migration_apply, migration_reject

from .common import perm_required, script_json
from .vendor import plotly_js_url

RANKMAP_FORMATS = (
    ("openmpi", "Open MPI appfile"),
    ("slurm", "Slurm script"),
    ("slurm-hostfile", "Slurm hostfile"),
    ("torchrun", "torchrun"),
)
RANK_GRID_MAX_NODES = 256
GROUPS_LISTED_PER_KIND = 64


def rank_grid(topo, gids) -> tuple[list[dict], int]:
    """Rows of the rank grid, one per node the job uses (in node order), each with one cell per
    GPU index holding that GPU's rank or None; and the number of GPU columns."""
    by_node: dict[int, dict[int, int]] = {}
    for rank, gid in enumerate(gids):
        by_node.setdefault(int(topo.gpu_node[gid]), {})[int(topo.gpu_index[gid])] = rank
    width = max((int(topo.node_gpu_count[n]) for n in by_node), default=0)
    rows = []
    for n in sorted(by_node):
        cells = [by_node[n].get(i) for i in range(int(topo.node_gpu_count[n]))]
        rows.append({"node": topo.nodes[n].name, "cells": cells + [""] * (width - len(cells))})
    return rows, width


def path_pair(topo, gids) -> dict | None:
    """Two of the job's GPUs whose path the job page links to (the cluster page's path view):
    rank 0 and the first rank under another leaf, else on another node, else rank 1; None for a
    one-GPU job. Each end as `node:gpu`."""
    if len(gids) < 2:
        return None
    first = int(gids[0])

    def far(key) -> int | None:
        return next((r for r, g in enumerate(gids) if key[int(g)] != key[first]), None)

    rank = far(topo.gpu_leaf)
    if rank is None:
        rank = far(topo.gpu_node)
    rank = 1 if rank is None else rank

    def end(gid: int) -> str:
        node, index = topo.gpu_key(int(gid))
        return f"{node}:{index}"

    return {"rank_a": 0, "rank_b": rank, "a": end(first), "b": end(gids[rank])}


def last_placement(job) -> list[dict]:
    """Per node of a finished job's last placement, in node-rank order: node name, GPU indices
    and ranks, as booked (the node may since have left the topology)."""
    return [
        {
            "node": node["node"],
            "gpus": sorted(r["gpu"] for r in node["ranks"]),
            "ranks": [r["rank"] for r in node["ranks"]],
        }
        for node in nodes_in_rank_order(job_ranks(job=job))
    ]


def group_summary(view) -> list[dict]:
    """Per group kind: how many groups, the worst level, slowest bottleneck (GB/s), slowest time
    (ms per step), and the first groups listed."""
    out = []
    for kind, groups in view.groups.items():
        levels = [g.level for g in groups]
        worst = max(levels, key=("nvlink", "leaf", "spine", "core").index)
        times = [g.time_ms for g in groups if g.time_ms is not None]
        out.append(
            {
                "kind": kind,
                "count": len(groups),
                "size": len(groups[0].ranks),
                "worst_level": worst,
                "min_bw": min(g.bottleneck_GBps for g in groups),
                "max_time": max(times) if times else None,
                "listed": groups[:GROUPS_LISTED_PER_KIND],
                "more": max(0, len(groups) - GROUPS_LISTED_PER_KIND),
            }
        )
    return out


# Every policy's placement of a job on the cluster as it is: computed again only when the
# cluster graph's signature (allocations, job states, node states, topology) or the job moved.
_WHAT_IF = SignatureCache(64)


@login_required
@require_GET
def job_page(request, pk: int):
    """`/jobs/N/`: the owner's or staff's view of one job (others get 404, as in the API)."""
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    log_args = {}
    for field, key in (("log_page", "page"), ("log_rank", "rank")):
        raw = request.GET.get(field, "")
        if raw:
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
                return HttpResponseBadRequest(f"{field}: a whole number, not {raw[:40]!r}")
            log_args[key] = int(raw)
    logs = job_rank_logs(job=job, **log_args)
    spec = load_job(job.spec)
    signature = graph_signature(cluster=job.cluster, user=request.user)
    # The cluster graph's data, shared with the graph, hot links and switch pages by its signature.
    snap = cluster_graph_data(cluster=job.cluster, user=request.user, signature=signature).snapshot
    topo = snap.topology
    active = next((a for a in snap.active if a.job_id == job.pk), None)
    placed = job.status in ACTIVE_STATUSES and active is not None and len(active.gids) == spec.gpus
    view = None
    grid, grid_width = [], 0
    if placed:
        view = job_view(
            topo,
            id=job.pk,
            label=job_label(request.user, job),
            details=True,
            job=spec,
            gids=active.gids,
            predicted=job.predicted,
            flows=active.flows,
            status=job.status,
        )
        if len({int(topo.gpu_node[g]) for g in active.gids}) <= RANK_GRID_MAX_NODES:
            grid, grid_width = rank_grid(topo, active.gids)
    # A finished job keeps its last placement as booked, even after its GPUs were replaced.
    history = [] if placed or job.status not in FINISHED_STATUSES else last_placement(job)
    whatif_rows = []
    whatif_key = (signature, job.pk, job.generation, job.status)
    if (placed or job.status in WAITING_STATUSES) and (whatif_rows := _WHAT_IF.get(whatif_key)) is None:
        whatif_rows = what_if(
            topo,
            spec,
            free=snap.free,
            own_gids=active.gids if placed else (),
            link_load=snap.link_load,
            own_flows=active.flows if placed else None,
            current_step_ms=job.predicted_step_ms if placed else None,
        )
        _WHAT_IF.put(whatif_key, whatif_rows)
    now = timezone.now()
    since = job.started_at or job.placed_at
    charts = {}
    points = job_series_points(job=job)
    if view is not None:
        charts = {
            "mfu": timeline_figure(
                title="MFU beside GPU utilisation",
                y_title="fraction",
                predicted=view.mfu,
                since=since,
                until=now,
                samples=points["mfu"],
                predicted_samples=points["predicted_mfu"],
                extra=[("GPU utilisation (measured)", points["util"], UTIL_COLOR)],
            ),
            "comm": timeline_figure(
                title="Comm share",
                y_title="comm share",
                predicted=view.comm_share,
                since=since,
                until=now,
                samples=points["comm"],
                predicted_samples=points["predicted_comm"],
            ),
        }
    if any(r.fits for r in whatif_rows):
        charts["whatif"] = whatif_figure(whatif_rows)
    unfinished = job.status not in FINISHED_STATUSES
    managed = unfinished and manages(request.user, job)
    context = {
        "job": job,
        "spec": spec,
        "cluster": job.cluster,
        "view": view,
        "label": job_label(request.user, job),
        "policy": job.policy or job.cluster.policy,
        "grid": grid,
        "grid_width": range(grid_width),
        "grid_hidden": placed and not grid,
        "path": path_pair(topo, active.gids) if placed else None,
        "history": history,
        "groups": group_summary(view) if view else [],
        "whatif": whatif_rows,
        "free_gpus": int(snap.free.sum()),
        "bound": lower_bound(topo, spec),
        "proposals": list(job_proposals(job=job)),
        "measured": metrics.job_latest_sample(job=job, fresh_s=metrics.freshness_s(cluster=job.cluster)),
        "report": metrics.job_latest_report(job=job),
        "hotspots": list(metrics.open_hotspots(job=job)),
        "rankmaps": [
            (fmt, label, f"/api/v1/jobs/{job.pk}/rankmap/?format={fmt}", RANKMAP_USAGE[fmt])
            for fmt, label in RANKMAP_FORMATS
        ],
        "generations": job_generations(job=job),
        "logs": logs,
        "priority": job_priority(job=job) if job.status not in FINISHED_STATUSES else None,
        "manages": managed,
        "may_cancel": managed or (unfinished and job.owner_id == request.user.pk),
        "priority_weights": priority_weights(),
        "charts": script_json(charts),
        "plotly_js_url": plotly_js_url("basic"),
    }
    return render(request, "dashboard/job.html", context)


@perm_required(roles.DECIDE_MIGRATIONS)
@require_POST
def proposal_decide(request, pk: int, proposal: int, action: str):
    """POST from the job page: apply or reject an open migration proposal (operators)."""
    prop = get_object_or_404(MigrationProposal, pk=proposal, job_id=pk)
    try:
        if action == "apply":
            prop = migration_apply(proposal=prop, user=request.user)
        else:
            prop = migration_reject(proposal=prop, user=request.user)
    except ProposalStateError as exc:
        messages.error(request, str(exc))
        return redirect("dashboard:job", pk=pk)
    if prop.status == ProposalStatus.APPLIED:
        messages.success(
            request,
            f"Migration {prop.pk} applied: predicted step {prop.predicted_old_step_ms:.3g} ms → "
            f"{prop.predicted_new_step_ms:.3g} ms.",
        )
    elif prop.status == ProposalStatus.STALE:
        messages.warning(request, f"Migration {prop.pk} is stale and was not applied: {prop.reason}")
    else:
        messages.info(request, f"Migration {prop.pk} {prop.status}.")
    return redirect("dashboard:job", pk=pk)


def manages(user, job) -> bool:
    """Whether `user` may hold, release, requeue, re-prioritise and cancel `job` (operators, its
    account's coordinators), as the API decides."""
    return roles.can(user, roles.MANAGE_JOBS) or coordinates(user, job.account_id)


MANAGE_SERVICES = {
    "cancel": lambda job, user, _: services.job_cancel(job=job, user=user),
    "hold": lambda job, user, _: services.job_hold(job=job, user=user),
    "release": lambda job, user, _: services.job_release(job=job, user=user),
    "requeue": lambda job, user, _: services.job_requeue(job=job, user=user),
    "priority": lambda job, user, value: services.job_set_priority(job=job, user=user, priority=value),
}


@login_required
@require_POST
def job_manage(request, pk: str, action: str):
    """POST from the job page: cancel, hold, release, requeue or re-prioritise the job (operators
    and its account's coordinators; its owner may cancel). Others who see the job get a 403."""
    job = get_object_or_404(visible_jobs(request.user), pk=int(pk))
    if not (manages(request.user, job) or (action == "cancel" and job.owner_id == request.user.pk)):
        raise PermissionDenied("this needs the operator role or a coordinator of the job's account")
    value = None
    if action == "priority":
        raw = request.POST.get("priority", "").strip()
        if not (raw.lstrip("-").isascii() and raw.lstrip("-").isdigit() and len(raw) <= 8):
            return HttpResponseBadRequest("priority: a whole number from -1,000,000 to 1,000,000")
        value = int(raw)
        if not -1_000_000 <= value <= 1_000_000:
            return HttpResponseBadRequest("priority: a whole number from -1,000,000 to 1,000,000")
    try:
        MANAGE_SERVICES[action](job, request.user, value)
    except services.JobStateError as exc:
        messages.error(request, str(exc))
    except SpecError as exc:
        messages.error(request, "; ".join(message for _, message in exc.errors))
    else:
        messages.success(request, f"Job {job.pk}: {action} done.")
    return redirect("dashboard:job", pk=pk)

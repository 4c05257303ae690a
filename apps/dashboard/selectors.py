"""Reads behind the dashboard pages: visibility rules, the cluster graph's data, the queue.

Visibility follows the API: staff see every job; a user sees the details of their own jobs, and
other users' jobs only as "job N (other user)" with status, GPU count, age and pending reason.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count, F, Max, Min, Q, QuerySet, Sum
from django.urls import reverse
from django.utils import timezone

from apps.api import roles
from apps.dashboard.jobview import JobView, job_view
from apps.dashboard.layout import ClusterLayout, cluster_layout
from apps.executors.models import ClusterExecutor, ExecutorKind, ForeignAllocation
from apps.metrics import selectors as metrics
from apps.metrics.models import GpuLatest, NicLatest, NodeScrape
from apps.placement.jobs import load_job
from apps.placement.topology import Topology
from apps.scheduling.choices import ACTIVE_STATUSES, FINISHED_STATUSES, WAITING_STATUSES, NodeState, RankState
from apps.scheduling.models import Allocation, Job, MigrationProposal, RankRun
from apps.scheduling.node_models import NodeHealth
from apps.scheduling.nodes import node_state_map, shown_state
from apps.scheduling.selectors import coordinated_ids, jobs_visible_to
from apps.scheduling.snapshot import ClusterSnapshot, cluster_snapshot
from apps.topology.choices import TIER_ORDER
from apps.topology.models import Cluster, Link, Nic, Node, Switch

_LAYOUTS: weakref.WeakKeyDictionary[Topology, ClusterLayout] = weakref.WeakKeyDictionary()
_LAYOUT_LOCK = threading.Lock()


def layout_for(topology: Topology) -> ClusterLayout:
    """The drawing layout of a topology snapshot, computed once per snapshot object."""
    with _LAYOUT_LOCK:
        hit = _LAYOUTS.get(topology)
    if hit is None:
        hit = cluster_layout(topology)
        with _LAYOUT_LOCK:
            _LAYOUTS[topology] = hit
    return hit


def can_see_details(user, job: Job) -> bool:
    """True if `user` may see the job's name, owner, spec, ranks and predictions: its owner, a
    viewer (operator, admin) or a coordinator of its account."""
    if job.owner_id == user.pk or roles.sees_all_jobs(user):
        return True
    return job.account_id is not None and job.account_id in coordinated_ids(user)


def job_label(user, job: Job) -> str:
    """How the job is named to `user`: "job 7 · bert (alice)", or "job 7 (other user)"."""
    if can_see_details(user, job):
        return f"job {job.pk} · {job.name} ({job.owner.get_username()})"
    return f"job {job.pk} (other user)"


def visible_jobs(user) -> QuerySet[Job]:
    """The jobs whose page `user` may open: all with scheduling.view_job, otherwise their own and
    those of the accounts they coordinate."""
    return jobs_visible_to(user=user).select_related("qos")


@dataclass(frozen=True)
class ClusterGraphData:
    """What the cluster page draws: the snapshot, its layout, one view per active job, and the
    nodes not simply up (`node_states`, by name, see `node_state_map`)."""

    cluster: Cluster
    snapshot: ClusterSnapshot
    layout: ClusterLayout
    jobs: list[JobView]
    queued: int
    node_states: dict | None = None


class SignatureCache:
    """An LRU of what was built, keyed by everything it was built from (a `graph_signature`, a
    job view's inputs), shared by a process's threads."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple):
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def get_many(self, keys) -> dict:
        """The values held for `keys` (those missing left out), under one lock."""
        with self._lock:
            found = {key: self._items[key] for key in keys if key in self._items}
            for key in found:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple, value) -> None:
        self.put_many({key: value})

    def put_many(self, items: dict) -> None:
        with self._lock:
            self._items.update(items)
            for key in items:
                self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_GRAPH_DATA = SignatureCache(8)


def cluster_graph_data(*, cluster: Cluster, user, signature: tuple | None = None) -> ClusterGraphData:
    """The snapshot of `cluster` with every placed job as `user` may see it; built again only
    when `graph_signature` (pass it when known) changes: the cluster page, the hot links and the
    switch pages of a 16k-GPU cluster share one build (about half a second with a thousand jobs).
    Callers treat it as read-only."""
    key = graph_signature(cluster=cluster, user=user) if signature is None else signature
    data = _GRAPH_DATA.get(key)
    if data is None:
        data = _cluster_graph_data(cluster=cluster, user=user, stamp=key[1])
        _GRAPH_DATA.put(key, data)
    return data


# Job views by everything they are built from (the cluster's topology version, the job's
# placement generation, prediction, status, GPUs and flows, and how the viewer sees it): a job's
# spec is fixed once submitted, so a rebuild after one job moved parses only that job again.
_VIEWS = SignatureCache(50_000)


def _cluster_graph_data(*, cluster: Cluster, user, stamp) -> ClusterGraphData:
    """The graph data of `cluster` for `user`; `stamp` is the cluster's `updated_at` as its
    signature read it (job views are kept by the topology version they were built on)."""
    snap = cluster_snapshot(cluster=cluster)
    topo = snap.topology
    gids_of = {a.job_id: a.gids for a in snap.active}
    flows_of = {a.job_id: a.flows for a in snap.active}
    rows = (
        Job.objects.filter(pk__in=list(gids_of), status__in=ACTIVE_STATUSES)
        .select_related("owner")
        .only("id", "name", "owner", "owner__username", "status", "gpus", "generation", "predicted_step_ms")
        .order_by("id")
    )
    keyed = []
    for job in rows:
        gids = gids_of.get(job.pk, ())
        if len(gids) != job.gpus:
            continue  # a job whose allocation rows are being replaced right now
        details = can_see_details(user, job)
        flows = flows_of.get(job.pk) or {}
        key = (
            cluster.pk,
            stamp,
            job.pk,
            job.generation,
            job.predicted_step_ms,
            job.status,
            details,
            job_label(user, job),
            tuple(gids),
            frozenset(flows.items()),
        )
        keyed.append((key, job))
    known = _VIEWS.get_many(key for key, _ in keyed)
    missing = [job.pk for key, job in keyed if key not in known]
    stored = {
        pk: (spec, predicted)
        for pk, spec, predicted in Job.objects.filter(pk__in=missing).values_list("pk", "spec", "predicted")
    }
    views, built = [], {}
    for key, job in keyed:
        view = known.get(key)
        if view is None:
            spec, predicted = stored[job.pk]
            details = key[6]
            view = built[key] = job_view(
                topo,
                id=job.pk,
                label=key[7],
                details=details,
                job=load_job(spec),
                gids=key[8],
                predicted=predicted if details else _public_prediction(predicted),
                flows=flows_of.get(job.pk),
                status=job.status,
                url=reverse("dashboard:job", args=[job.pk]) if details else None,
                traffic=predicted,
            )
        views.append(view)
    _VIEWS.put_many(built)
    views += foreign_job_views(cluster=cluster, topology=topo)
    queued = Job.objects.filter(cluster=cluster, status__in=WAITING_STATUSES).count()
    states = node_state_map(cluster_id=cluster.pk)
    return ClusterGraphData(cluster, snap, layout_for(topo), views, queued, states)


def slurm_executor(*, cluster: Cluster) -> ClusterExecutor | None:
    """The cluster's Slurm connection when Slurm runs its jobs (None for the node agents)."""
    return ClusterExecutor.objects.filter(cluster=cluster, kind=ExecutorKind.SLURM).first()


def foreign_job_views(*, cluster: Cluster, topology: Topology) -> list[JobView]:
    """Jobs submitted straight to Slurm (clusters run by the Slurm executor), one view each with
    the GPUs they hold, labelled "slurm job 4711 (user)"; negative ids keep them apart from
    TopoWeb's jobs."""
    held: dict[int, tuple[str, list[int]]] = {}
    rows = (
        ForeignAllocation.objects.filter(cluster=cluster)
        .select_related("node")
        .order_by("slurm_job_id", "node_id", "gpu_index")
    )
    for f in rows:
        try:
            gid = topology.gid(f.node.name, f.gpu_index)
        except KeyError:
            continue
        held.setdefault(f.slurm_job_id, (f.label, []))[1].append(gid)
    return [
        JobView(id=-slurm_id, label=label, details=False, gids=tuple(gids), status="running in Slurm")
        for slurm_id, (label, gids) in held.items()
    ]


def _public_prediction(predicted: dict | None) -> dict:
    # Other users' jobs still colour the metric overlays, but without their groups.
    p = predicted or {}
    return {k: p.get(k) for k in ("comm_ms", "step_ms", "mfu")}


def queue_jobs(
    *,
    user,
    statuses: Iterable[str],
    owner: str = "",
    cluster: Cluster | None = None,
    finished_between: tuple | None = None,
    order: tuple[str, ...] | None = None,
) -> QuerySet[Job]:
    """Jobs of the queue page, filtered by status, owner username and cluster, and finished jobs
    by their finish time (`finished_between`, either end None for open); ordered by `order`, by
    default highest priority and oldest first, or with a finish-time range the last finished
    first. Every user sees every job here; labels hide other
    users' details, and a user who may not see all jobs filtering by another owner gets nothing
    (ownership is not revealed)."""
    # A running job's predicted block and flows run to tens of kB of JSON that no queue row shows.
    jobs = Job.objects.select_related("cluster", "owner").defer("predicted", "flows")
    statuses = [str(s) for s in statuses]
    if finished_between is None:
        jobs = jobs.filter(status__in=statuses)
    else:
        since, until = finished_between
        finished = [s for s in statuses if s in FINISHED_STATUSES]
        window = Q(status__in=finished)
        if since is not None:
            window &= Q(finished_at__gte=since)
        if until is not None:
            window &= Q(finished_at__lt=until)
        # The range narrows finished jobs only; waiting and running ones asked for stay listed.
        # Two plain terms (not "finished in the range, or not finished") so that Postgres reads
        # the finished ones off the finish-time index instead of the whole history.
        others = [s for s in statuses if s not in FINISHED_STATUSES]
        jobs = jobs.filter(window | Q(status__in=others) if others else window)
    if owner:
        if owner != user.get_username() and not roles.sees_all_jobs(user):
            return jobs.none()
        jobs = jobs.filter(owner__username=owner)
    if cluster is not None:
        jobs = jobs.filter(cluster=cluster)
    if order is None:
        # The queue: highest priority, then oldest first; a history: the last finished first.
        order = (
            # Jobs still waiting or running (no finish time) first on SQLite and Postgres alike,
            # the order Postgres reads the finish-time index backwards in.
            (F("finished_at").desc(nulls_first=True), "-id")
            if finished_between is not None
            else ("-priority", "submitted_at", "id")
        )
    return jobs.order_by(*order)


def job_nodes(*, job_ids: Iterable[int]) -> dict[int, list[str]]:
    """The nodes of each job's current generation (as booked, so a finished job keeps its last
    ones), by job id, in node-name order."""
    rows = (
        Allocation.objects.filter(job_id__in=list(job_ids), generation=F("job__generation"))
        .values_list("job_id", "node_name")
        .order_by("job_id", "node_name")
        .distinct()
    )
    out: dict[int, list[str]] = {}
    for job_id, node in rows:
        out.setdefault(job_id, []).append(node)
    return out


def job_proposals(*, job: Job) -> QuerySet[MigrationProposal]:
    """The job's migration proposals, newest first."""
    return job.migration_proposals.select_related("decided_by").order_by("-created_at", "-id")


def graph_signature(*, cluster: Cluster, user) -> tuple:
    """A cheap key (four queries) that changes whenever the cluster graph `user` sees would:
    topology edits, allocations booked or released, job status or prediction changes, node
    states (down, drained, draining, no agent, unhealthy GPUs)."""
    live = Allocation.objects.filter(live=True, job__cluster=cluster).aggregate(
        n=Count("id"), top=Max("id"), total=Sum("id")
    )
    jobs = tuple(
        Job.objects.filter(cluster=cluster, status__in=(*ACTIVE_STATUSES, *WAITING_STATUSES))
        .order_by("id")
        .values_list("id", "status", "predicted_step_ms")
    )
    stamp = Cluster.objects.filter(pk=cluster.pk).values_list("updated_at", flat=True).first()
    viewer = "all" if roles.sees_all_jobs(user) else user.pk
    agents = NodeHealth.objects.filter(node__cluster=cluster)
    marked = tuple(
        agents.filter(~Q(state=NodeState.UP) | ~Q(unhealthy_gpus=[]) | Q(last_seen__isnull=True))
        .order_by("node_id")
        .values_list("node_id", "state", "reason", "unhealthy_gpus", "state_since")
    )
    foreign = ForeignAllocation.objects.filter(cluster=cluster).aggregate(n=Count("id"), top=Max("id"))
    return (
        cluster.pk,
        stamp,
        (foreign["n"], foreign["top"]),
        live["n"],
        live["top"],
        live["total"],
        jobs,
        viewer,
        agents.count(),
        repr(marked),
    )


RECENT_JOBS_ON_NODE = 10


STOPPING_LISTED = 50


def stopping_ranks(*, user, node: Node | None = None) -> list[dict]:
    """Ranks told to stop that still run (their GPUs stay booked until their exits are
    confirmed), one row per job generation and node, the longest stopping first: the job (as
    `user` may see it), node, ranks, and since when."""
    rows = (
        RankRun.objects.filter(state=RankState.STARTED, stop_requested_at__isnull=False)
        .filter(**({"node": node} if node is not None else {}))
        .values("job_id", "generation", "node__name", "node__cluster__name")
        .annotate(since=Min("stop_requested_at"), ranks=Count("id"))
        .order_by("since", "job_id")[:STOPPING_LISTED]
    )
    rows = list(rows)
    jobs = Job.objects.select_related("owner").in_bulk({r["job_id"] for r in rows})
    out = []
    for r in rows:
        job = jobs.get(r["job_id"])
        if job is None:
            continue
        out.append(
            {
                "job": job,
                "label": job_label(user, job),
                "url": reverse("dashboard:job", args=[job.pk]) if can_see_details(user, job) else None,
                "generation": r["generation"],
                "node": r["node__name"],
                "cluster": r["node__cluster__name"],
                "ranks": r["ranks"],
                "since": r["since"],
            }
        )
    return out


def node_overview(*, node: Node, user) -> dict:
    """Everything the node page shows: each GPU (NVLink domain, NIC, job and rank, health, latest
    measurement), each NIC (speed, leaf, the GPUs using it, measured rates), the jobs on it now and
    the last finished ones, and the agent's health. Jobs are labelled as `user` may see them."""
    agent = NodeHealth.objects.filter(node=node).first()
    unhealthy = {
        int(g.get("gpu", -1)): str(g.get("reason", "")) for g in (agent.unhealthy_gpus if agent else ())
    }
    fresh_s = metrics.freshness_s(cluster=node.cluster)
    now = timezone.now()
    latest = {
        m.gpu_id: m
        for m in GpuLatest.objects.filter(gpu__node=node, instance="").only(
            "gpu_id", "at", "gpu_util", "tensor_active", "power_W", "temp_C", "xid_last"
        )
    }
    live = list(
        Allocation.objects.filter(live=True, gpu__node=node)
        .select_related("job__owner")
        .only("gpu_id", "rank", "job__id", "job__name", "job__status", "job__owner__username")
    )
    jobs: dict[int, dict] = {}
    by_gpu = {}
    for alloc in live:
        job = alloc.job
        entry = jobs.get(job.pk)
        if entry is None:
            entry = jobs[job.pk] = {
                "job": job,
                "label": job_label(user, job),
                "url": reverse("dashboard:job", args=[job.pk]) if can_see_details(user, job) else None,
                "ranks": [],
                "gpus": [],
            }
        by_gpu[alloc.gpu_id] = (entry, alloc.rank)
    gpus = []
    for gpu in node.gpus.select_related("domain", "nic").order_by("index"):
        entry, rank = by_gpu.get(gpu.pk, (None, None))
        if entry is not None:
            entry["ranks"].append(rank)
            entry["gpus"].append(gpu.index)
        sample = latest.get(gpu.pk)
        age_s = (now - sample.at).total_seconds() if sample else None
        gpus.append(
            {
                "gpu": gpu,
                "job": entry,
                "rank": rank,
                "unhealthy": unhealthy.get(gpu.index),
                "measured": sample if age_s is not None and age_s <= fresh_s else None,
                "measured_age_s": age_s,
            }
        )
    nic_rates = {n.device: n for n in NicLatest.objects.filter(node=node)}
    nics = []
    for nic in node.nics.select_related("leaf").order_by("id"):
        rate = nic_rates.get(nic.name)
        peak = max((r for r in (rate.tx_Bps, rate.rx_Bps) if r is not None), default=None) if rate else None
        nics.append(
            {
                "nic": nic,
                "gpus": [g["gpu"].index for g in gpus if g["gpu"].nic_id == nic.pk],
                "rate": rate,
                "load": peak / (nic.bw_GBps * 1e9) if peak is not None else None,
            }
        )
    for entry in jobs.values():
        entry["ranks"].sort()
    # By GPU (an indexed key); released allocations keep their GPU until a topology replace.
    ran_here = Allocation.objects.filter(gpu__node=node).values("job_id")
    recent = (
        Job.objects.filter(pk__in=ran_here, status__in=FINISHED_STATUSES)
        .select_related("owner")
        .order_by("-finished_at", "-id")[:RECENT_JOBS_ON_NODE]
    )
    return {
        "gpus": gpus,
        "nics": nics,
        "leaves": sorted({n["nic"].leaf.name for n in nics}),
        "jobs": sorted(jobs.values(), key=lambda e: e["job"].pk),
        "stopping": stopping_ranks(user=user, node=node),
        "recent": [
            {
                "job": job,
                "label": job_label(user, job),
                "url": reverse("dashboard:job", args=[job.pk]) if can_see_details(user, job) else None,
            }
            for job in recent
        ],
        "agent": agent,
        "state": shown_state(agent),
        "pairs": intra_pairs(node.intra),
        "scrape": NodeScrape.objects.filter(node=node).first(),
        "fresh_s": fresh_s,
    }


def intra_pairs(intra: dict | None) -> list[list[dict]] | None:
    """The node's GPU-pair matrix from its spec `intra` block: per row, per column, the link class
    ("NV2", "PIX", "SYS"...) with its GB/s and µs (None on the diagonal); None without one."""
    if not isinstance(intra, dict) or not isinstance(intra.get("links"), list):
        return None
    classes = intra.get("classes") or {}
    rows = []
    for i, row in enumerate(intra["links"]):
        cells = []
        for j, cls in enumerate(row):
            spec = classes.get(cls) or {}
            cells.append(
                None
                if i == j
                else {"cls": str(cls), "bw_GBps": spec.get("bw_GBps"), "latency_us": spec.get("latency_us")}
            )
        rows.append(cells)
    return rows


SWITCH_NODES_LISTED = 512


def switch_overview(*, switch: Switch) -> dict:
    """The switch page: its links (the switch at the other end, GB/s, µs; parallel cables summed)
    and, for a leaf, the nodes cabled to it with how many of each node's NICs and their GB/s."""
    peers: dict[tuple[str, str], dict] = {}
    links = Link.objects.filter(Q(a=switch) | Q(b=switch)).select_related("a", "b")
    for link in links:
        other = link.b if link.a_id == switch.pk else link.a
        entry = peers.setdefault(
            (other.tier, other.name),
            {"switch": other, "cables": 0, "bw_GBps": 0.0, "latency_us": link.latency_us},
        )
        entry["cables"] += 1
        entry["bw_GBps"] += link.bw_GBps
    nodes = list(
        Nic.objects.filter(leaf=switch)
        .values("node__name")
        .annotate(nics=Count("id"), bw_GBps=Sum("bw_GBps"))
        .order_by("node__position", "node__name")[: SWITCH_NODES_LISTED + 1]
    )
    return {
        "peers": sorted(peers.values(), key=lambda p: (TIER_ORDER[p["switch"].tier], p["switch"].name)),
        "nodes": nodes[:SWITCH_NODES_LISTED],
        "more_nodes": len(nodes) > SWITCH_NODES_LISTED,
    }

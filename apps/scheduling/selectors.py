"""Read-only queries of the scheduling app, for views, templates, serializers and the dashboard."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection, models
from django.db.models import Case, Count, Exists, F, OuterRef, Q, QuerySet, Value, When

from apps.api import roles
from apps.placement.topology import SpecError
from apps.topology.models import Cluster, Gpu, Node
from apps.topology.selectors import cluster_named

from . import snapshot as snap
from .choices import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    INFRA_EXIT_CAUSES,
    WAITING_STATUSES,
    ProposalStatus,
    RankState,
)
from .models import (
    AccountMembership,
    Allocation,
    Job,
    LauncherToken,
    MigrationProposal,
    NodeHealth,
    RankLogChunk,
    RankRun,
    SchedulingCycle,
    UnixAccount,
)


def coordinated_accounts(user):
    """The ids of the accounts `user` coordinates, as a subquery (no query of its own)."""
    return AccountMembership.objects.filter(user_id=user.pk, is_coordinator=True).values("account_id")


def coordinated_ids(user) -> frozenset[int]:
    """The ids of the accounts `user` coordinates, read once per user object (one query)."""
    if user is None or not user.is_authenticated:
        return frozenset()
    ids = getattr(user, "_coordinated_ids", None)
    if ids is None:
        ids = frozenset(coordinated_accounts(user).values_list("account_id", flat=True))
        user._coordinated_ids = ids
    return ids


def coordinates(user, account_id: int | None) -> bool:
    """True if `user` is a coordinator of account `account_id` (one query; none for no account)."""
    if account_id is None or user is None or not user.is_authenticated:
        return False
    return AccountMembership.objects.filter(
        user_id=user.pk, account_id=account_id, is_coordinator=True
    ).exists()


def jobs_visible_to(
    *, user: AbstractBaseUser | AnonymousUser, launcher: LauncherToken | None = None
) -> QuerySet[Job]:
    """Jobs a caller may see: a launcher token its cluster's, a user holding scheduling.view_job
    (viewer, operator, admin) all, another user their own and those of the accounts they
    coordinate."""
    base = Job.objects.select_related("cluster", "owner")
    if launcher is not None:
        return base.filter(cluster_id=launcher.cluster_id)
    if roles.sees_all_jobs(user):
        return base.all()
    if not getattr(user, "is_authenticated", False):
        return base.none()
    return base.filter(own_or_coordinated(user))


def own_or_coordinated(user) -> Q:
    """The condition on jobs for `user`'s own and those of the accounts they coordinate, with the
    account ids read first (`coordinated_ids`, one query) and written in: most users coordinate
    none, and `owner = me` alone is an index scan of their jobs, where `owner = me OR account IN
    (subquery)` read every job of the table (60 ms per page count at 200,000 jobs, 0.3 ms alone)."""
    ids = coordinated_ids(user)
    mine = Q(owner_id=user.pk)
    return mine | Q(account_id__in=sorted(ids)) if ids else mine


MASKED = "********"


def spec_shown(*, job: Job, user=None, node=None) -> dict:
    """The job's stored spec as `user` (or the node agent of `node`) may see it: in full for its
    owner and for a node running one of its ranks; for everyone else the `env` values are masked
    (the names stay), since people put secrets there."""
    spec = job.spec
    env = spec.get("env") if isinstance(spec, dict) else None
    if not env or (user is not None and user.pk is not None and user.pk == job.owner_id):
        return spec
    if node is not None and jobs_on_node(node=node).filter(pk=job.pk).exists():
        return spec
    return {**spec, "env": dict.fromkeys(env, MASKED)}


def jobs_on_node(*, node) -> QuerySet[Job]:
    """Jobs with a live rank on `node` (what its node agent may speak for)."""
    on = Allocation.objects.filter(job=OuterRef("pk"), live=True, node_name=node.name)
    return (
        Job.objects.select_related("cluster", "owner").filter(cluster_id=node.cluster_id).filter(Exists(on))
    )


def cluster_for_spec(*, spec: Any, name: str | None = None, recent: bool = False) -> Cluster:
    """The cluster a spec is for: `name` if given, else the spec's `cluster` field. SpecError on
    `cluster` when neither names an existing cluster. `recent=True`: a row this process read a
    moment ago may answer (`topology.selectors.cluster_named`)."""
    name = name or (spec.get("cluster") if isinstance(spec, dict) else None)
    if not name:
        raise SpecError([("cluster", "required: name the cluster in the spec or submit to one")])
    name = str(name)
    found = cluster_named(name, recent=recent)
    # An id is up to 18 ASCII digits ("²" passes isdigit() but int() refuses it).
    if found is None and name.isascii() and name.isdigit() and len(name) <= 18:
        found = Cluster.objects.filter(pk=int(name)).first()
    if found is None:
        raise SpecError([("cluster", f"unknown cluster {name[:40]!r}")])
    return found


def queue_for_cluster(*, cluster: Cluster) -> QuerySet[Job]:
    """The cluster's waiting jobs (queued or preempted) in the order the cycle walks them:
    priority (high first), then submission time."""
    return Job.objects.filter(cluster=cluster, status__in=WAITING_STATUSES).order_by(
        "-priority", "submitted_at", "id"
    )


def running_jobs(*, cluster: Cluster) -> QuerySet[Job]:
    """Jobs holding GPUs on the cluster (placing or running), oldest placement first."""
    return Job.objects.filter(cluster=cluster, status__in=ACTIVE_STATUSES).order_by("placed_at", "id")


def free_gpus(*, cluster: Cluster) -> QuerySet[Gpu]:
    """GPUs of the cluster with no live allocation, by node order and index."""
    live = Allocation.objects.filter(gpu=OuterRef("pk"), live=True)
    return (
        Gpu.objects.filter(node__cluster=cluster)
        .exclude(Exists(live))
        .select_related("node")
        .order_by("node__position", "node_id", "index")
    )


def link_loads(*, cluster: Cluster) -> dict[str, float]:
    """Heavy flows on each leaf's uplinks (leaf name -> sum of the active jobs' flows)."""
    loads: dict[str, float] = {}
    for flows in running_jobs(cluster=cluster).values_list("flows", flat=True):
        for leaf, flow in (flows or {}).items():
            loads[leaf] = loads.get(leaf, 0.0) + float(flow)
    return loads


def gpu_assignments(*, cluster: Cluster) -> dict[tuple[str, int], tuple[int, int]]:
    """Live allocations of the cluster: (node name, GPU index) -> (job id, rank)."""
    rows = Allocation.objects.filter(live=True, job__cluster=cluster).values_list(
        "gpu__node__name", "gpu__index", "job_id", "rank"
    )
    return {(node, index): (job_id, rank) for node, index, job_id, rank in rows}


def job_ranks(*, job: Job) -> list[dict[str, Any]]:
    """The job's current (or, once finished, last) placement by rank: rank, node, gpu index, nic.

    The rows of its current generation (a migrating job's new GPUs, some still waiting for the
    old ranks); a job placed before generations existed shows its live rows. Live rows name their
    GPU as the topology names it now; a finished job's released rows by the values they were
    booked with (its GPUs may since have been replaced).
    """
    rows = Allocation.objects.filter(job=job, generation=job.generation)
    if not rows.exists():
        rows = Allocation.objects.filter(job=job)
    fields = ("rank", "gpu__node__name", "gpu__index", "gpu__nic__name")
    # A finished job whose ranks are still stopping holds some of its rows live: its placement
    # is all of them, as booked.
    if job.status not in FINISHED_STATUSES and rows.filter(live=True).exists():
        rows = rows.filter(live=True)
    else:
        fields = ("rank", "node_name", "gpu_index", "nic_name")
    return [
        {"rank": rank, "node": node, "gpu": index, "nic": nic or ""}
        for rank, node, index, nic in rows.order_by("rank").values_list(*fields)
    ]


def job_placement(*, job: Job) -> dict[str, Any] | None:
    """The job's placement in the placement output format (job, policy, ranks, predicted), or
    None if it was never placed."""
    ranks = job_ranks(job=job)
    if not ranks:
        return None
    return {
        "job": job.name,
        "policy": job.placed_policy,
        "ranks": [{"rank": r["rank"], "node": r["node"], "gpu": r["gpu"]} for r in ranks],
        "predicted": job.predicted,
    }


def placement_preview(*, cluster: Cluster, spec: Any, username: str) -> dict[str, Any]:
    """Every policy's placement of a job spec on the cluster's free GPUs now, with predicted
    comm/step (ms) and MFU, plus the lower bound; nothing is booked. SpecError on a bad spec."""
    return snap.preview(cluster=cluster, data=spec, username=username)


def latest_cycle(*, cluster: Cluster) -> SchedulingCycle | None:
    """The most recent scheduling cycle of the cluster, or None."""
    return SchedulingCycle.objects.filter(cluster=cluster).order_by("-started_at", "-id").first()


def open_proposals(*, cluster: Cluster | None = None) -> QuerySet[MigrationProposal]:
    """Migration proposals still awaiting a decision, best gain first."""
    qs = MigrationProposal.objects.filter(status=ProposalStatus.PROPOSED).select_related(
        "job", "job__cluster"
    )
    if cluster is not None:
        qs = qs.filter(job__cluster=cluster)
    return qs.order_by("-predicted_gain", "id")


def proposals_visible_to(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[MigrationProposal]:
    """Proposals a user may see: all with scheduling.view_migrationproposal, else their own jobs'."""
    qs = MigrationProposal.objects.select_related("job", "job__cluster", "job__owner")
    if roles.can(user, "scheduling.view_migrationproposal"):
        return qs.all()
    if not getattr(user, "is_authenticated", False):
        return qs.none()
    return qs.filter(job__owner=user)


def run_as(*, user_id: int, username: str) -> str:
    """The Unix account a user's ranks run as, on every executor: their UnixAccount, else their
    username."""
    return UnixAccount.objects.filter(user_id=user_id).values_list("name", flat=True).first() or username


def master_port(job_id: int, generation: int) -> int:
    """The rendezvous port of a generation booked before ports were stored with its rank 0 (a
    port of TOPOWEB_MASTER_PORTS from its job and generation); see `lifecycle.assign_master_ports`."""
    low, high = settings.TOPOWEB_MASTER_PORTS
    return low + (job_id * 64 + generation) % (high - low + 1)


def rendezvous_addrs(*, cluster_id: int, nodes: list[str]) -> dict[str, str]:
    """MASTER_ADDR for a rank 0 on each of `nodes`: the address its node health records (the node
    agent's --addr; on a Slurm cluster, Slurm's NodeAddr), else its name. Every executor gives
    the ranks this address and every rank map shows it."""
    nodes = list(nodes)
    if not nodes:
        return {}
    # Asked by every sync of a node with work: one short statement, not an ORM query built each time.
    with connection.cursor() as cursor:
        cursor.execute(_addrs_sql(len(nodes)), [cluster_id, *nodes])
        addrs = dict(cursor.fetchall())
    return {n: addrs.get(n, n) for n in nodes}


@functools.lru_cache(maxsize=64)
def _addrs_sql(count: int) -> str:
    """The (node name, agent address) of `count` named nodes of a cluster with an address."""
    qn = connection.ops.quote_name
    health, node = qn(NodeHealth._meta.db_table), qn(Node._meta.db_table)
    names = ", ".join(["%s"] * count)
    return (
        f"SELECT n.name, h.addr FROM {health} h JOIN {node} n ON n.id = h.node_id"
        f" WHERE n.cluster_id = %s AND n.name IN ({names}) AND h.addr <> ''"
    )


def job_master_addr(*, job: Job, ranks: list[dict[str, Any]]) -> str | None:
    """The MASTER_ADDR of the job's rank map `ranks` (`rendezvous_addrs` of rank 0's node)."""
    first = min(ranks, key=lambda r: r["rank"], default=None)
    if first is None:
        return None
    return rendezvous_addrs(cluster_id=job.cluster_id, nodes=[first["node"]])[first["node"]]


def generation_master_port(job_id: int, generation: int) -> int:
    """The MASTER_PORT of a job generation, as its agents give it to the ranks."""
    port = (
        Allocation.objects.filter(job_id=job_id, generation=generation, rank=0)
        .values_list("master_port", flat=True)
        .first()
    )
    return port or master_port(job_id, generation)


def job_generations(*, job: Job) -> list[dict[str, Any]]:
    """Per generation of the job, newest first: how many ranks started, run, exited 0 and failed."""
    rows = (
        RankRun.objects.filter(job=job)
        .values("generation")
        .annotate(
            started=Count("id"),
            running=Count("id", filter=Q(state=RankState.STARTED)),
            ok=Count("id", filter=Q(state=RankState.EXITED, exit_code=0)),
        )
        .order_by("-generation")
    )
    return [
        {
            **row,
            "failed": row["started"] - row["running"] - row["ok"],
            "current": row["generation"] == job.generation,
        }
        for row in rows
    ]


@dataclass(frozen=True)
class RankLogPage:
    """One page of a job's rank logs: `runs` in reading order, out of `total`, page `page` of
    `pages`, and every rank the picker offers."""

    runs: list
    total: int
    page: int
    pages: int
    per_page: int
    ranks: list[int]
    rank: int | None

    @property
    def first(self) -> int:
        return (self.page - 1) * self.per_page + 1 if self.total else 0

    @property
    def last(self) -> int:
        return min(self.total, self.page * self.per_page)


def job_rank_logs(*, job: Job, page: int = 1, per_page: int = 16, rank: int | None = None) -> RankLogPage:
    """Every rank's output, a page at a time: failures of any generation first (newest
    generation first), those of the ranks' own doing (a non-zero exit, a limit) before those
    TopoWeb or a fault ended (stopped, fenced, lost), then the current generation's ranks by
    rank, output or not; `rank` keeps one rank's runs only. A page past the last is the last."""
    failed = Q(state=RankState.EXITED) & (~Q(exit_code=0) | Q(exit_cause__in=INFRA_EXIT_CAUSES))
    own = failed & ~Q(exit_cause__in=INFRA_EXIT_CAUSES)
    runs = RankRun.objects.filter(job=job).filter(Q(generation=job.generation) | failed)
    ranks = sorted(set(runs.values_list("rank", flat=True)))
    if rank is not None:
        runs = runs.filter(rank=rank)
    runs = runs.annotate(
        failed_first=Case(When(own, then=Value(0)), When(failed, then=Value(1)), default=Value(2))
    ).order_by("failed_first", "-generation", "rank")
    total = runs.count()
    pages = max(1, -(-total // per_page))
    page = min(max(1, page), pages)
    start = (page - 1) * per_page
    items = list(runs.select_related("node")[start : start + per_page])
    return RankLogPage(items, total, page, pages, per_page, ranks, rank)


def rank_log_page(*, run: RankRun, offset: int, limit: int) -> dict[str, Any]:
    """A page of a rank run's stored log: the chunks from byte `offset` on (a chunk starting
    before it is left out: pass a `next_offset` back), at least one and about `limit` bytes."""
    chunks = RankLogChunk.objects.filter(run=run, offset__gte=offset).order_by("offset")
    size = RankLogChunk.objects.filter(run=run).aggregate(end=models.Max(F("offset") + F("size")))["end"] or 0
    texts: list[str] = []
    taken = 0
    first = None
    next_offset = offset
    for chunk in chunks.iterator(chunk_size=64):
        if texts and taken + chunk.size > limit:
            break
        if first is None:
            first = chunk.offset
        texts.append(chunk.text)
        taken += chunk.size
        next_offset = chunk.offset + chunk.size
    return {
        "offset": offset if first is None else first,
        "next_offset": max(next_offset, offset),
        "size": int(size),
        "more": int(size) > max(next_offset, offset),
        "cut": int(size) >= rank_log_max_bytes(),
        "text": "".join(texts),
    }


def rank_log_max_bytes() -> int:
    """The output the server keeps per rank run."""
    return int(float(getattr(settings, "TOPOWEB_RANK_LOG_MAX_MB", 64)) * 1024 * 1024)

"""What a node agent should run: its node's work, read only.

A generation's rank map and launch fields never change, so they are cached per process.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Case, Count, Q, Value, When

from apps.placement.jobs import load_job
from apps.topology.models import Gpu, Nic, Node

from .choices import NO_AGENT, SHOWN_NODE_STATES, UNHEALTHY, JobStatus, NodeState, RankState
from .models import Allocation, Job, NodeAgent, RankRun

_CACHE: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()
_CACHE_SIZE = 4096
_LOCK = threading.Lock()


def master_port(job_id: int, generation: int) -> int:
    """The rendezvous port of a generation booked before ports were stored with its rank 0 (a
    port of TOPOWEB_MASTER_PORTS from its job and generation); see `lifecycle.assign_master_ports`."""
    low, high = settings.TOPOWEB_MASTER_PORTS
    return low + (job_id * 64 + generation) % (high - low + 1)


def generation_master_port(job_id: int, generation: int) -> int:
    """The MASTER_PORT of a job generation, as its agents give it to the ranks."""
    port = (
        Allocation.objects.filter(job_id=job_id, generation=generation, rank=0)
        .values_list("master_port", flat=True)
        .first()
    )
    return port or master_port(job_id, generation)


def _generation(job_id: int, generation: int) -> dict[str, Any] | None:
    key = (job_id, generation)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    job = (
        Job.objects.filter(pk=job_id)
        .values_list("name", "spec", "gpus", "owner__username", "owner__unix_account__name")
        .first()
    )
    if job is None:
        return None
    launch = load_job(job[1]).launch
    rows = list(
        Allocation.objects.filter(job_id=job_id, generation=generation)
        .order_by("rank")
        .values_list("gpu__node__name", "master_port")
    )
    if len(rows) != job[2]:
        return None
    nodes = [name for name, _ in rows]
    node_rank: dict[str, int] = {}
    for name in nodes:
        node_rank.setdefault(name, len(node_rank))
    info = {
        "job": job_id,
        "generation": generation,
        "name": job[0],
        "command": list(launch.command),
        "env": dict(launch.env),
        "workdir": launch.workdir,
        "account": job[4] or job[3],
        "stop_grace_s": launch.stop_grace_s,
        "world_size": job[2],
        "master_node": nodes[0],
        "master_port": rows[0][1] or master_port(job_id, generation),
        "node_rank": node_rank,
    }
    with _LOCK:
        _CACHE[key] = info
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return info


NODE_CACHE_S = 30.0
_NODES: dict[tuple[int, str], tuple[Node, float]] = {}
_NODES_SIZE = 65536


def sync_node(*, cluster_id: int, name: str) -> tuple[Node | None, NodeAgent | None]:
    """The cluster's node `name` (None if there is none) and its agent row (None: never had one).

    Every agent asks this every poll: a node found once is remembered per process for
    NODE_CACHE_S seconds (its id, name and cluster only), and then only its agent row is read,
    by one prepared statement. An agent row found proves the node still exists (it is deleted
    with it); without one the node is looked up again."""
    now = time.monotonic()
    hit = _NODES.get((cluster_id, name))
    if hit is not None and hit[1] > now:
        agent = next(iter(NodeAgent.objects.raw(_agent_sql(), [hit[0].pk])), None)
        if agent is not None:
            return hit[0], agent
    node = Node.objects.select_related("agent").filter(cluster_id=cluster_id, name=name).first()
    if node is None:
        return None, None
    agent = getattr(node, "agent", None)
    if len(_NODES) >= _NODES_SIZE:
        _NODES.clear()
    # A bare copy: the cached instance is shared by threads and must not carry a stale agent.
    _NODES[(cluster_id, name)] = (
        Node(pk=node.pk, name=node.name, cluster_id=node.cluster_id),
        now + NODE_CACHE_S,
    )
    return node, agent


_GPU_INDEXES: dict[int, tuple[frozenset[int], float]] = {}


def node_gpu_indexes(*, node: Node) -> frozenset[int]:
    """The GPU indexes the topology gives the node, remembered per process for NODE_CACHE_S
    seconds (an agent's inventory is checked against them every poll)."""
    now = time.monotonic()
    hit = _GPU_INDEXES.get(node.pk)
    if hit is not None and hit[1] > now:
        return hit[0]
    indexes = frozenset(node.gpus.values_list("index", flat=True))
    if len(_GPU_INDEXES) >= _NODES_SIZE:
        _GPU_INDEXES.clear()
    _GPU_INDEXES[node.pk] = (indexes, now + NODE_CACHE_S)
    return indexes


@functools.cache
def _agent_sql() -> str:
    return f"SELECT * FROM {connection.ops.quote_name(NodeAgent._meta.db_table)} WHERE node_id = %s"


@functools.cache
def _work_sql() -> str:
    """One statement for both halves of the node's desired state: the node's live, current-generation
    allocations of placing or running jobs whose rank has not exited (stop 0: job, generation,
    rank, GPU index, NIC name), then the ranks still counted as running on it whose generation is
    no longer wanted (stop 1: job, generation, rank)."""
    qn = connection.ops.quote_name
    alloc, job, gpu, nic, run = (qn(m._meta.db_table) for m in (Allocation, Job, Gpu, Nic, RankRun))
    rank, index = qn("rank"), qn("index")
    return (
        f"SELECT a.job_id, a.generation, a.{rank}, g.{index}, n.name, 0 FROM {alloc} a"
        f" JOIN {job} j ON j.id = a.job_id JOIN {gpu} g ON g.id = a.gpu_id"
        f" LEFT JOIN {nic} n ON n.id = g.nic_id"
        " WHERE g.node_id = %s AND a.live = %s AND a.generation = j.generation AND j.status IN (%s, %s)"
        f" AND NOT EXISTS (SELECT 1 FROM {run} r WHERE r.job_id = a.job_id"
        f" AND r.generation = a.generation AND r.{rank} = a.{rank} AND r.state = %s)"
        f" UNION ALL SELECT r.job_id, r.generation, r.{rank}, NULL, NULL, 1 FROM {run} r"
        f" JOIN {job} j ON j.id = r.job_id WHERE r.node_id = %s AND r.state = %s"
        " AND NOT (j.status IN (%s, %s) AND r.generation = j.generation)"
        " ORDER BY 1, 2, 3"
    )


def node_work(*, node: Node) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """The node's desired state: (work, stops).

    `work`: every job generation the node should run now, each with this node's ranks: entries
    of `job`, `generation`, `name`, `command`, `env`, `workdir`, `account` (the Unix account of
    the job's owner: its UnixAccount, else its username), `stop_grace_s`, `world_size`,
    `master_addr`, `master_port`, `node_rank` and `ranks` ({"rank", "node", "gpu", "nic",
    "started"}). Ranks already exited are left out; jobs without a `command` too (an outside
    launcher runs those).

    `stops`: [job, generation, rank] of every rank the server still counts as running on the node
    (its GPU stays booked) although its generation is no longer wanted: its job ended, was
    requeued or is migrating. The agent stops each, or reports it gone when it has no trace of
    it; the GPU is released once the exit is reported."""
    # Every agent asks this every poll: one statement written once, not an ORM query built each time.
    placing, running, started = JobStatus.PLACING.value, JobStatus.RUNNING.value, RankState.STARTED.value
    with connection.cursor() as cursor:
        cursor.execute(
            _work_sql(),
            [node.pk, True, placing, running, RankState.EXITED.value, node.pk, started, placing, running],
        )
        rows = cursor.fetchall()
    grouped: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    stops: list[list[int]] = []
    for job_id, generation, rank, index, nic, stop in rows:
        if stop:
            stops.append([job_id, generation, rank])
        else:
            grouped.setdefault((job_id, generation), []).append((rank, index, nic or ""))
    if not grouped:
        return [], stops
    started_ranks = set(
        RankRun.objects.filter(node=node, state=RankState.STARTED).values_list("job_id", "generation", "rank")
    )
    work = []
    masters: dict[str, str] = {}
    for (job_id, generation), ranks in grouped.items():
        info = _generation(job_id, generation)
        if info is None or not info["command"]:
            continue
        masters.setdefault(info["master_node"], info["master_node"])
        work.append(
            {
                **{k: v for k, v in info.items() if k not in ("node_rank", "master_node")},
                "master_node": info["master_node"],
                "node_rank": info["node_rank"][node.name],
                "ranks": [
                    {
                        "rank": rank,
                        "node": node.name,
                        "gpu": index,
                        "nic": nic,
                        "started": (job_id, generation, rank) in started_ranks,
                    }
                    for rank, index, nic in ranks
                ],
            }
        )
    addrs = dict(
        NodeAgent.objects.filter(node__cluster_id=node.cluster_id, node__name__in=list(masters))
        .exclude(addr="")
        .values_list("node__name", "addr")
    )
    for entry in work:
        master = entry.pop("master_node")
        entry["master_addr"] = addrs.get(master, master)
    return work, stops


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
    generation first), then the current generation's ranks by rank, output or not; `rank` keeps
    one rank's runs only. A page past the last is the last."""
    failed = Q(state=RankState.EXITED) & ~Q(exit_code=0)
    runs = RankRun.objects.filter(job=job).filter(Q(generation=job.generation) | failed)
    ranks = sorted(set(runs.values_list("rank", flat=True)))
    if rank is not None:
        runs = runs.filter(rank=rank)
    runs = runs.annotate(failed_first=Case(When(failed, then=Value(0)), default=Value(1))).order_by(
        "failed_first", "-generation", "rank"
    )
    total = runs.count()
    pages = max(1, -(-total // per_page))
    page = min(max(1, page), pages)
    start = (page - 1) * per_page
    items = list(runs.select_related("node")[start : start + per_page])
    return RankLogPage(items, total, page, pages, per_page, ranks, rank)


def shown_state(agent: NodeAgent | None) -> str:
    """The node's state as the pages show it: its agent's state, or "no_agent" when no agent ever
    reported (no row, or an up row without a heartbeat)."""
    if agent is None or (agent.state == NodeState.UP and agent.last_seen is None):
        return NO_AGENT
    return agent.state


def node_state_q(state: str) -> Q:
    """A filter on nodes for one of NODE_STATE_FILTERS."""
    if state == UNHEALTHY:
        return Q(agent__isnull=False) & ~Q(agent__unhealthy_gpus=[])
    if state == NO_AGENT:
        return Q(agent__isnull=True) | Q(agent__state=NodeState.UP, agent__last_seen__isnull=True)
    if state == NodeState.UP:
        return Q(agent__state=NodeState.UP, agent__last_seen__isnull=False)
    return Q(agent__state=state)


def node_rows(*, cluster_id: int, state: str = "") -> list[dict[str, Any]]:
    """The cluster's nodes as `sinfo -N` lists them, in topology order, optionally only those in
    `state` (one of NODE_STATE_FILTERS): name, shown state, reason, since when, last heartbeat,
    GPUs, GPUs booked, unhealthy GPUs ([{"gpu", "reason"}]) and the leaf."""
    nodes = Node.objects.filter(cluster_id=cluster_id).select_related("agent", "leaf")
    if state:
        nodes = nodes.filter(node_state_q(state))
    nodes = nodes.annotate(n_gpus=Count("gpus", distinct=True)).order_by("position", "id")
    busy = dict(
        Allocation.objects.filter(live=True, gpu__node__cluster_id=cluster_id)
        .values("gpu__node_id")
        .annotate(n=Count("id"))
        .values_list("gpu__node_id", "n")
    )
    rows = []
    for node in nodes:
        agent = getattr(node, "agent", None)
        rows.append(
            {
                "node": node.name,
                "state": shown_state(agent),
                "reason": agent.reason if agent else "",
                "since": agent.state_since if agent else None,
                "last_seen": agent.last_seen if agent else None,
                "gpus": node.n_gpus,
                "busy": busy.get(node.pk, 0),
                "unhealthy": list(agent.unhealthy_gpus or ()) if agent else [],
                "leaf": node.leaf.name if node.leaf_id else "",
            }
        )
    return rows


def node_state_map(*, cluster_id: int) -> dict[str, dict[str, Any]]:
    """Nodes not simply up, by name: {"state", "reason", "since", "unhealthy": [GPU index]}; a
    node with no agent row at all is "no_agent" too."""
    out: dict[str, dict[str, Any]] = {}
    rows = NodeAgent.objects.filter(node__cluster_id=cluster_id).values_list(
        "node__name", "state", "reason", "state_since", "last_seen", "unhealthy_gpus"
    )
    seen = set()
    for name, state, reason, since, last_seen, bad in rows:
        seen.add(name)
        shown = NO_AGENT if state == NodeState.UP and last_seen is None else state
        gpus = sorted(int(g.get("gpu", -1)) for g in bad or () if isinstance(g, dict))
        if shown != NodeState.UP or gpus:
            out[name] = {"state": shown, "reason": reason, "since": since, "unhealthy": gpus}
    for name in (
        Node.objects.filter(cluster_id=cluster_id).exclude(agent__isnull=False).values_list("name", flat=True)
    ):
        if name not in seen:
            out[name] = {"state": NO_AGENT, "reason": "", "since": None, "unhealthy": []}
    return out


def cluster_health(*, cluster_id: int) -> dict[str, Any]:
    """Node health of a cluster at a glance: counts per shown state (a node no agent ever
    reported from counts as "no_agent", not up), nodes not up with their reasons and since when,
    and unhealthy GPUs as "node:index (reason)"."""
    rows = list(
        NodeAgent.objects.filter(node__cluster_id=cluster_id)
        .order_by("node__position", "node_id")
        .values_list("node__name", "state", "reason", "unhealthy_gpus", "last_seen", "state_since")
    )
    total = Node.objects.filter(cluster_id=cluster_id).count()
    counts = {state: 0 for state in SHOWN_NODE_STATES}
    shown = []
    for name, state, reason, bad, seen, since in rows:
        s = NO_AGENT if state == NodeState.UP and seen is None else state
        counts[s] += 1
        shown.append((name, s, reason, bad, seen, since))
    counts[NO_AGENT] += total - len(rows)
    return {
        "counts": counts,
        "nodes_total": total,
        "agents": sum(1 for r in rows if r[4] is not None),
        "nodes": [
            {"node": name, "state": s, "reason": reason, "last_seen": seen, "since": since}
            for name, s, reason, _, seen, since in shown
            if s not in (NodeState.UP, NO_AGENT)
        ],
        "unhealthy": [
            f"{name}:{g.get('gpu')} ({g.get('reason', '')})"
            for name, _, _, bad, _, _ in shown
            for g in bad or ()
        ],
        "unhealthy_nodes": [name for name, _, _, bad, _, _ in shown if bad],
    }

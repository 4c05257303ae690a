"""What a node agent should run: its node's work, read only.

A generation's rank map and launch fields never change, so they are cached per process.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from typing import Any

from django.db import connection

from apps.placement.jobs import load_job
from apps.scheduling.choices import JobStatus, RankState
from apps.scheduling.models import Allocation, Job, NodeHealth, RankRun
from apps.scheduling.selectors import master_port
from apps.topology.models import Cluster, Gpu, Nic, Node
from topoweb.postgres.prepared import fetch_all

from ..models import ClusterExecutor

_CACHE: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()
_CACHE_SIZE = 4096
_LOCK = threading.Lock()


# (job id, generation) -> the lock held while one thread reads it: the agents of a placed job's
# nodes all ask at once, and the others wait for that one's answer instead of each reading it.
_LOADING: dict[tuple[int, int], threading.Lock] = {}


def _generation(job_id: int, generation: int) -> dict[str, Any] | None:
    key = (job_id, generation)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            loading = _LOADING.setdefault(key, threading.Lock())
    if hit is not None:
        return hit
    with loading:
        with _LOCK:
            hit = _CACHE.get(key)
        if hit is not None:
            return hit
        try:
            info = _read_generation(job_id, generation)
            if info is not None:
                with _LOCK:
                    _CACHE[key] = info
                    while len(_CACHE) > _CACHE_SIZE:
                        _CACHE.popitem(last=False)
        finally:
            with _LOCK:
                _LOADING.pop(key, None)
    return info


def _read_generation(job_id: int, generation: int) -> dict[str, Any] | None:
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
        "pids_max": launch.pids_max,
        "memory_mb": launch.memory_mb,
        "world_size": job[2],
        "master_node": nodes[0],
        "master_port": rows[0][1] or master_port(job_id, generation),
        "node_rank": node_rank,
    }
    return info


# A node's GPU indexes, as the topology gives them, are remembered this long: longer than agents'
# polls (at most 60 s), or a node's every sync would read them again. A change of a node's GPUs in
# the topology (a rare edit) is seen within it.
GPU_INDEXES_CACHE_S = 300.0
_NODES_SIZE = 65536


Work = tuple[list[dict[str, Any]], list[list[int]]]


def sync_node(*, node_id: int, with_work: bool = False) -> tuple[Node | None, NodeHealth | None, Work | None]:
    """The node `node_id` (None if it no longer exists), its agent row (None: never had one) and,
    `with_work`, its `node_work` (else None), in one round trip: every agent asks this every poll
    (on Postgres both statements go together, prepared: `topoweb.postgres.prepared`; SQLite reads
    them one after the other). The node comes bare (id, name, cluster); the agent row carries
    this server's id for the cluster (`server_id`, None when the cluster has no executor row yet)
    and the cluster's name (`cluster_name`)."""
    statements = [(_sync_node_sql(), [node_id])]
    if with_work:
        statements.append((_work_sql(), _work_params(node_id)))
    results = fetch_all(statements)
    row = results[0][0] if results[0] else None
    if row is None:
        return None, None, None
    name, cluster_id, cluster_name, server_id, *columns = row
    node = Node(pk=node_id, name=name, cluster_id=cluster_id)
    work = _work_of(node, results[1]) if with_work else None
    if columns[0] is None:  # no agent row (its id is never null)
        return node, None, work
    fields, converters = _agent_columns()
    values = []
    for value, (col, convert) in zip(columns, converters, strict=True):
        for converter in convert:
            value = converter(value, col, connection)
        values.append(value)
    agent = NodeHealth.from_db(connection.alias, fields, values)
    agent.server_id, agent.cluster_name = server_id, cluster_name
    return node, agent, work


@functools.cache
def _agent_columns() -> tuple[list[str], list[tuple[Any, list]]]:
    """The agent row's field names in column order, and each column with its converters from
    database values, as the ORM applies them (JSON text to Python, SQLite's datetimes...)."""
    fields = NodeHealth._meta.concrete_fields
    converters = []
    for field in fields:
        col = field.get_col(NodeHealth._meta.db_table)
        converters.append((col, connection.ops.get_db_converters(col) + col.get_db_converters(connection)))
    return [f.attname for f in fields], converters


@functools.cache
def _sync_node_sql() -> str:
    qn = connection.ops.quote_name
    agent, node, cluster, executor = (
        qn(m._meta.db_table) for m in (NodeHealth, Node, Cluster, ClusterExecutor)
    )
    columns = ", ".join(f"a.{qn(f.column)}" for f in NodeHealth._meta.concrete_fields)
    return (
        f"SELECT n.name, n.cluster_id, c.name, e.server_id, {columns} FROM {node} n"
        f" JOIN {cluster} c ON c.id = n.cluster_id LEFT JOIN {executor} e ON e.cluster_id = n.cluster_id"
        f" LEFT JOIN {agent} a ON a.node_id = n.id WHERE n.id = %s"
    )


_GPU_INDEXES: dict[int, tuple[frozenset[int], float]] = {}


def forget_gpu_indexes() -> None:
    """Forget the remembered GPU indexes (tests: each starts with its own database)."""
    _GPU_INDEXES.clear()


def node_gpu_indexes(*, node: Node) -> frozenset[int]:
    """The GPU indexes the topology gives the node, remembered per process for
    GPU_INDEXES_CACHE_S seconds (an agent's inventory is checked against them every poll)."""
    now = time.monotonic()
    hit = _GPU_INDEXES.get(node.pk)
    if hit is not None and hit[1] > now:
        return hit[0]
    indexes = frozenset(node.gpus.values_list("index", flat=True))
    if len(_GPU_INDEXES) >= _NODES_SIZE:
        _GPU_INDEXES.clear()
    _GPU_INDEXES[node.pk] = (indexes, now + GPU_INDEXES_CACHE_S)
    return indexes


@functools.cache
def _work_sql() -> str:
    """One statement for both halves of the node's desired state: the node's live, current-generation
    allocations of placing or running jobs whose rank has not exited (stop 0: job, generation,
    rank, GPU index, NIC name, whether its start was recorded, and the address rank 0's node's
    agent recorded, its rendezvous address, as `rendezvous_addrs` reads it), then the ranks still
    counted as running on it whose generation is no longer wanted (stop 1: job, generation,
    rank)."""
    qn = connection.ops.quote_name
    alloc, job, gpu, nic, run, health = (
        qn(m._meta.db_table) for m in (Allocation, Job, Gpu, Nic, RankRun, NodeHealth)
    )
    rank, index = qn("rank"), qn("index")
    master_addr = (
        f"(SELECT h.addr FROM {alloc} a0 JOIN {gpu} g0 ON g0.id = a0.gpu_id"
        f" JOIN {health} h ON h.node_id = g0.node_id WHERE a0.job_id = a.job_id"
        f" AND a0.generation = a.generation AND a0.{rank} = 0 AND h.addr <> '')"
    )
    return (
        f"SELECT a.job_id, a.generation, a.{rank}, g.{index}, n.name, r.id IS NOT NULL, 0, {master_addr}"
        f" FROM {alloc} a"
        f" JOIN {job} j ON j.id = a.job_id JOIN {gpu} g ON g.id = a.gpu_id"
        f" LEFT JOIN {nic} n ON n.id = g.nic_id"
        # At most one run per (job, generation, rank): the rank's, if it was reported.
        f" LEFT JOIN {run} r ON r.job_id = a.job_id AND r.generation = a.generation AND r.{rank} = a.{rank}"
        " WHERE g.node_id = %s AND a.live = %s AND a.generation = j.generation AND j.status IN (%s, %s)"
        " AND (r.id IS NULL OR r.state <> %s)"
        f" UNION ALL SELECT r.job_id, r.generation, r.{rank}, NULL, NULL, NULL, 1, NULL FROM {run} r"
        f" JOIN {job} j ON j.id = r.job_id WHERE r.node_id = %s AND r.state = %s"
        " AND NOT (j.status IN (%s, %s) AND r.generation = j.generation)"
        " ORDER BY 1, 2, 3"
    )


def node_work(*, node: Node) -> Work:
    """The node's desired state: (work, stops).

    `work`: every job generation the node should run now, each with this node's ranks: entries
    of `job`, `generation`, `name`, `command`, `env`, `workdir`, `account` (the Unix account of
    the job's owner: its UnixAccount, else its username), `stop_grace_s`, `pids_max` and
    `memory_mb` (per-rank limits, null: the agent's own), `world_size`,
    `master_addr`, `master_port`, `node_rank` and `ranks` ({"rank", "node", "gpu", "nic",
    "started"}). Ranks already exited are left out; jobs without a `command` too (an outside
    launcher runs those).

    `stops`: [job, generation, rank] of every rank the server still counts as running on the node
    (its GPU stays booked) although its generation is no longer wanted: its job ended, was
    requeued or is migrating. The agent stops each, or reports it gone when it has no trace of
    it; the GPU is released once the exit is reported."""
    # Every agent asks this every poll: one statement written once, not an ORM query built each time.
    return _work_of(node, fetch_all([(_work_sql(), _work_params(node.pk))])[0])


def _work_params(node_id: int) -> list[Any]:
    placing, running, started = JobStatus.PLACING.value, JobStatus.RUNNING.value, RankState.STARTED.value
    return [node_id, True, placing, running, RankState.EXITED.value, node_id, started, placing, running]


def _work_of(node: Node, rows: list[tuple]) -> Work:
    """`node_work` from the rows of `_work_sql()`."""
    grouped: dict[tuple[int, int], list[tuple[int, int, str, bool]]] = {}
    addrs: dict[tuple[int, int], str | None] = {}
    stops: list[list[int]] = []
    for job_id, generation, rank, index, nic, started, stop, addr in rows:
        if stop:
            stops.append([job_id, generation, rank])
        else:
            grouped.setdefault((job_id, generation), []).append((rank, index, nic or "", bool(started)))
            addrs[(job_id, generation)] = addr
    work = []
    for (job_id, generation), ranks in grouped.items():
        info = _generation(job_id, generation)
        if info is None or not info["command"]:
            continue
        work.append(
            {
                **{k: v for k, v in info.items() if k not in ("node_rank", "master_node")},
                # MASTER_ADDR: rank 0's node's recorded address, else its name.
                "master_addr": addrs[(job_id, generation)] or info["master_node"],
                "node_rank": info["node_rank"][node.name],
                "ranks": [
                    {
                        "rank": rank,
                        "node": node.name,
                        "gpu": index,
                        "nic": nic,
                        "started": started,
                    }
                    for rank, index, nic, started in ranks
                ],
            }
        )
    return work, stops

"""The one translation layer between ORM rows and the placement core's plain dataclasses.

Reads: a cluster's topology, busy GPUs, link loads and active jobs as a `ClusterSnapshot`; queued
jobs as `QueuedJob`s carrying their `JobSpec`; a core `Placement` as Job prediction fields. The
writes that book GPUs are the lifecycle's (`lifecycle.py`).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db import connection
from django.db.models import Q

from apps.placement.costmodel import Prediction, evaluate
from apps.placement.costmodel.speed import check_job_models
from apps.placement.jobs import JobSpec, job_to_spec, load_job
from apps.placement.planning import ActiveJob, ClusterSnapshot, GpuIndex, QueuedJob
from apps.placement.solvers import POLICIES, NoFit, Placement, place, placement_output
from apps.placement.topology import SpecError, Topology, shorten
from apps.topology.models import Cluster, Gpu
from apps.topology.services import cluster_topology

from .choices import ACTIVE_STATUSES, UNSCHEDULABLE_NODE_STATES, WAITING_STATUSES, JobStatus, RankState
from .executor import foreign_holds
from .models import Allocation, Job, NodeHealth, RankRun

log = logging.getLogger(__name__)

_INDEX_CACHE: dict[tuple[int, Any], GpuIndex] = {}
_INDEX_LOCK = threading.Lock()


def gpu_index(*, cluster: Cluster, topology: Topology) -> GpuIndex:
    """The gid <-> Gpu row mapping of a cluster, cached per cluster and `updated_at`."""
    key = (cluster.pk, cluster.updated_at)
    with _INDEX_LOCK:
        cached = _INDEX_CACHE.get(key)
    if cached is not None and len(cached.gpu_pk) == topology.n_gpus:
        return cached
    pks = [0] * topology.n_gpus
    nics = [""] * topology.n_gpus
    rows = Gpu.objects.filter(node__cluster=cluster).values_list("pk", "node__name", "index", "nic__name")
    for pk, node, index, nic in rows:
        gid = topology.gid(node, index)
        pks[gid] = pk
        nics[gid] = nic or ""
    index = GpuIndex(tuple(pks), {pk: gid for gid, pk in enumerate(pks)}, tuple(nics))
    with _INDEX_LOCK:
        # Drop entries of older versions of this cluster.
        for old in [k for k in _INDEX_CACHE if k[0] == cluster.pk]:
            del _INDEX_CACHE[old]
        _INDEX_CACHE[key] = index
    return index


def cluster_snapshot(*, cluster: Cluster, fresh: bool = False) -> ClusterSnapshot:
    """Topology, busy GPUs, link loads and active jobs of a cluster, read now (6 queries).

    Busy: every live allocation of any generation (a migrating job's old GPUs stay busy until its
    old ranks exited), the GPUs of down, draining and drained nodes, and GPUs reported unhealthy.
    An active job's gids are those of its current generation. Stopping: live allocations of jobs
    no longer active, or of an active job's older generation (not a migrating job's: those GPUs
    pass to its new generation), on schedulable GPUs. `fresh`: as for `cluster_topology`.
    """
    topology = cluster_topology(cluster=cluster, fresh=fresh)
    index = gpu_index(cluster=cluster, topology=topology)
    return assemble_snapshot(
        cluster=cluster, topology=topology, index=index, holds=read_holds(cluster=cluster, index=index)
    )


@dataclass(frozen=True, slots=True)
class JobHold:
    """What one job holds: the gids of its live allocations by generation (in rank order) and,
    while it is active, the `ActiveJob` the planner sees (gids of its current generation)."""

    ranks: Mapping[int, tuple[int, ...]]
    active: ActiveJob | None = None
    generation: int | None = None
    migrating: bool = False


def read_holds(
    *, cluster: Cluster, index: GpuIndex, job_ids: Iterable[int] | None = None
) -> dict[int, JobHold]:
    """Every job of the cluster that is active or has live allocations, by id (3 queries);
    with `job_ids`, only those jobs (an id left out of the result holds nothing)."""
    allocations = Allocation.objects.filter(live=True)
    started = RankRun.objects.filter(state=RankState.STARTED)
    jobs = Job.objects.filter(cluster=cluster, status__in=ACTIVE_STATUSES)
    if job_ids is None:
        allocations = allocations.filter(job__cluster=cluster)
        started = started.filter(job__cluster=cluster)
    else:
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        allocations = allocations.filter(job_id__in=ids)
        started = started.filter(job_id__in=ids)
        jobs = jobs.filter(pk__in=ids)
    gid_of_pk = index.gid_of_pk
    ranks: dict[int, dict[int, list[int]]] = {}
    live = allocations.order_by("job_id", "generation", "rank").values_list("job_id", "generation", "gpu_id")
    for job_id, generation, gpu_id in live:
        ranks.setdefault(job_id, {}).setdefault(generation, []).append(gid_of_pk[gpu_id])
    launched = set(started.values_list("job_id", flat=True).distinct())
    holds = {
        job_id: JobHold(ranks={gen: tuple(gids) for gen, gids in by_gen.items()})
        for job_id, by_gen in ranks.items()
    }
    rows = jobs.values_list(
        "id",
        "priority",
        "flows",
        "status",
        "placed_at",
        "started_at",
        "estimated_runtime_s",
        "time_limit_min",
        "overdue",
        "generation",
        "submitted_at",
        "account_id",
        "borrowed",
        "owner_id",
        "qos_id",
    )
    for (
        pk,
        priority,
        flows,
        status,
        placed_at,
        started_at,
        runtime_s,
        time_limit_min,
        overdue,
        generation,
        submitted_at,
        account_id,
        borrowed,
        owner_id,
        qos_id,
    ) in rows:
        held = holds.get(pk, JobHold(ranks={})).ranks
        begin = started_at or placed_at
        migrating = status == JobStatus.MIGRATING
        holds[pk] = JobHold(
            ranks=held,
            active=ActiveJob(
                job_id=pk,
                priority=priority,
                gids=held.get(generation, ()),
                flows=flows or {},
                begin=begin,
                expected_end=None
                if begin is None or runtime_s is None
                else begin + timedelta(seconds=runtime_s),
                running=status == JobStatus.RUNNING,
                started_at=started_at,
                estimated_runtime_s=runtime_s,
                overdue=overdue,
                launched=pk in launched or migrating,
                migrating=migrating,
                account=account_id,
                borrowed=borrowed,
                submitted_at=submitted_at,
                owner=owner_id,
                qos=qos_id,
                limit_end=None
                if begin is None or time_limit_min is None
                else begin + timedelta(minutes=time_limit_min),
            ),
            generation=generation,
            migrating=migrating,
        )
    return holds


def assemble_snapshot(
    *, cluster: Cluster, topology: Topology, index: GpuIndex, holds: Mapping[int, JobHold]
) -> ClusterSnapshot:
    """The snapshot of `holds` (see `read_holds`) with the cluster's unschedulable GPUs read now
    (2 queries). Returns new arrays and lists: the planner may change them."""
    usable = np.ones(topology.n_gpus, dtype=bool)
    link_load = dict(_mark_unschedulable(cluster, topology, usable))
    busy: list[int] = []
    stopping_gids: list[int] = []
    active: list[ActiveJob] = []
    for job_id in sorted(holds):
        hold = holds[job_id]
        for generation, gids in hold.ranks.items():
            busy.extend(gids)
            if hold.active is None or (generation != hold.generation and not hold.migrating):
                stopping_gids.extend(gids)
        if hold.active is not None:
            active.append(hold.active)
            for leaf, load in hold.active.flows.items():
                link_load[leaf] = link_load.get(leaf, 0.0) + float(load)
    free = usable.copy()
    free[np.asarray(busy, dtype=np.intp)] = False
    stopping = np.zeros(topology.n_gpus, dtype=bool)
    stopping[np.asarray(stopping_gids, dtype=np.intp)] = True
    stopping &= usable
    return ClusterSnapshot(cluster.pk, topology, index, free, link_load, active, stopping)


def _mark_unschedulable(cluster: Cluster, topology: Topology, free: np.ndarray) -> dict[str, float]:
    """Clear from `free` the GPUs of nodes that take no placements (down, draining, drained, or
    still stopping orphan processes its agent found), GPUs reported unhealthy and
    GPUs held by Slurm jobs TopoWeb did not submit. Returns those jobs' assumed load on leaf
    uplinks (GB/s by leaf name): the cluster executor's `foreign_gbps_per_gpu` for each GPU of a
    job that spans leaf switches (their traffic is otherwise unknown)."""
    rows = (
        NodeHealth.objects.filter(node__cluster=cluster)
        .filter(Q(state__in=UNSCHEDULABLE_NODE_STATES) | ~Q(unhealthy_gpus=[]) | ~Q(orphans=[]))
        .values_list("node__name", "state", "unhealthy_gpus", "orphans")
    )
    by_name = topology.node_by_name
    # GPUs that jobs submitted straight to Slurm hold (clusters run by the Slurm executor).
    leaves: dict[int, dict[str, int]] = {}
    rate = 0.0
    for hold in foreign_holds(cluster):
        name, gpu, slurm_job, gbps = hold.node, hold.gpu_index, hold.holder, hold.gbps_per_gpu
        n = by_name.get(name)
        if n is not None and 0 <= gpu < int(topology.node_gpu_count[n]):
            free[int(topology.node_first_gid[n]) + gpu] = False
            leaf = int(topology.node_leaf[n])
            if leaf >= 0:
                per_leaf = leaves.setdefault(slurm_job, {})
                per_leaf[topology.leaf_names[leaf]] = per_leaf.get(topology.leaf_names[leaf], 0) + 1
        rate = float(gbps or 0.0)
    foreign_load: dict[str, float] = {}
    for per_leaf in leaves.values():
        if rate > 0 and len(per_leaf) > 1:
            for leaf_name, count in per_leaf.items():
                foreign_load[leaf_name] = foreign_load.get(leaf_name, 0.0) + rate * count
    for name, state, unhealthy, orphans in rows:
        n = by_name.get(name)
        if n is None:
            continue
        first, count = int(topology.node_first_gid[n]), int(topology.node_gpu_count[n])
        if state in UNSCHEDULABLE_NODE_STATES or orphans:
            free[first : first + count] = False
            continue
        for entry in unhealthy or ():
            gpu = entry.get("gpu") if isinstance(entry, Mapping) else None
            if isinstance(gpu, int) and 0 <= gpu < count:
                free[first + gpu] = False
    return foreign_load


_SPEC_CACHE: OrderedDict[tuple[int, datetime], JobSpec] = OrderedDict()
_SPEC_CACHE_SIZE = 4096
_SPEC_LOCK = threading.Lock()


def queued_jobs(*, cluster: Cluster, unreadable: dict[int, str] | None = None) -> list[QueuedJob]:
    """The cluster's waiting jobs (queued or preempted, not held) by priority, then age.

    A job's spec never changes after submission, so parsed specs are cached per process (keyed by
    id and submission time) and only new jobs' spec JSON is read. A stored spec that no longer
    loads (stored before a rule it breaks) is left out, with the reason in `unreadable` by job id.
    """
    rows = list(
        Job.objects.filter(cluster=cluster, status__in=WAITING_STATUSES, held=False)
        .order_by("-priority", "submitted_at", "id")
        .values_list(
            "id", "priority", "submitted_at", "policy", "pending_reason", "account_id", "owner_id", "qos_id"
        )
    )
    with _SPEC_LOCK:
        specs = {pk: _SPEC_CACHE.get((pk, at)) for pk, _, at, *_ in rows}
    missing = [pk for pk, spec in specs.items() if spec is None]
    if missing:
        loaded = {}
        for pk, data in Job.objects.filter(pk__in=missing).values_list("id", "spec"):
            try:
                loaded[pk] = load_job(data)
            except SpecError as exc:
                if unreadable is not None:
                    unreadable[pk] = f"its stored spec is invalid: {shorten(str(exc), 500)}"
        specs.update(loaded)
        with _SPEC_LOCK:
            for pk, _, at, *_ in rows:
                if pk in loaded:
                    _SPEC_CACHE[(pk, at)] = loaded[pk]
            while len(_SPEC_CACHE) > _SPEC_CACHE_SIZE:
                _SPEC_CACHE.popitem(last=False)
    return [
        QueuedJob(
            job_id=pk,
            priority=prio,
            submitted_at=at,
            spec=specs[pk],
            policy=policy,
            pending_reason=reason,
            account=account,
            owner=owner,
            qos=qos,
        )
        for pk, prio, at, policy, reason, account, owner, qos in rows
        if specs[pk] is not None
    ]


def prepare_submission(*, cluster: Cluster, data: Any, username: str, fresh: bool = False) -> dict[str, Any]:
    """Validate a job spec v1 for `cluster` and return the Job fields to create.

    Raises SpecError naming each bad field; a job that could never be placed on the empty
    cluster (more GPUs than it has, or a shape no policy can fit) is an error on `gpus`, one whose
    compute would need more than its reference GPU's peak names `model.flops_per_step` and
    `step.compute_ms`, a GPU model the cluster lacks `gpu_models[i]` or `step.gpu_model`.
    `fresh=True`: `cluster` was read from the database just now (see `cluster_topology`).
    """
    if not isinstance(data, Mapping):
        raise SpecError([("", f"a job spec must be a mapping, got {type(data).__name__}")])
    data = dict(data)
    # Over REST the user is the authenticated one; a `user` in the body is ignored.
    data["user"] = username
    named = data.get("cluster")
    if named is None:
        data["cluster"] = cluster.name
    elif named != cluster.name:
        raise SpecError(
            [("cluster", f"the spec names cluster {named!r} but is submitted to {cluster.name!r}")]
        )
    spec = load_job(data)
    topology = cluster_topology(cluster=cluster, fresh=fresh)
    if spec.gpus > topology.n_gpus:
        raise SpecError(
            [("gpus", f"needs {spec.gpus} GPUs but cluster {cluster.name!r} has {topology.n_gpus}")]
        )
    # GPU models the cluster lacks; compute faster than the reference GPU could do it (an MFU
    # above 100%, physically impossible).
    check_job_models(topology, spec)
    never = never_fits(topology, spec, spec.policy or cluster.policy)
    if never:
        raise SpecError([("gpus", f"can never be placed on cluster {cluster.name!r}: {never}")])
    return {
        "name": spec.name,
        "spec": job_to_spec(spec),
        "priority": spec.priority,
        "policy": spec.policy,
        "gpus": spec.gpus,
        "estimated_runtime_s": spec.estimated_runtime_s,
        "time_limit_min": spec.launch.time_limit_min,
    }


_NEVER_FITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def never_fits(topology: Topology, spec: JobSpec, policy: str) -> str:
    """Why `policy` cannot place `spec` even on the empty cluster ("" if it can)."""
    # Cached per topology and gang shape: fitting an empty cluster does not depend on traffic.
    shape = (policy, spec.gpus, spec.tp, spec.pp, spec.dp, spec.ep, spec.rank_order, spec.gpu_models)
    with _SPEC_LOCK:
        known = _NEVER_FITS.setdefault(topology, {})
        if shape in known:
            return known[shape]
    empty = place(topology, np.ones(topology.n_gpus, dtype=bool), {}, spec, policy=policy)
    reason = empty.reason if isinstance(empty, NoFit) else ""
    with _SPEC_LOCK:
        known[shape] = reason
    return reason


def job_spec(job: Job) -> JobSpec:
    """The core JobSpec of a stored job."""
    return load_job(job.spec)


def mapping(topology: Topology, gids: Iterable[int]) -> list[dict[str, Any]]:
    """A rank mapping as placement-output `ranks` entries: [{"rank", "node", "gpu"}, ...]."""
    out = []
    for rank, gid in enumerate(gids):
        node, index = topology.gpu_key(int(gid))
        out.append({"rank": rank, "node": node, "gpu": index})
    return out


def gids_of_mapping(topology: Topology, ranks: Iterable[Mapping[str, Any]]) -> tuple[int, ...]:
    """gids, in rank order, of a placement-output `ranks` list."""
    entries = sorted(ranks, key=lambda e: e["rank"])
    return tuple(topology.gid(e["node"], int(e["gpu"])) for e in entries)


def prediction_fields(topology: Topology, spec: JobSpec, placement: Placement) -> dict[str, Any]:
    """Job fields holding a placement's predicted costs (ms per step, MFU fraction) and flows."""
    predicted = placement_output(topology, spec, placement)["predicted"]
    p: Prediction = placement.prediction
    # The solvers return finite predictions only; an infinite one must never reach the rows.
    if not all(math.isfinite(x) for x in (p.comm_ms, p.step_ms, 0.0 if p.mfu is None else p.mfu)):
        raise ValueError(f"job {spec.name}: predicted times must be finite, got step_ms={p.step_ms}")
    return {
        "placed_policy": placement.policy,
        "predicted_comm_ms": float(p.comm_ms),
        "predicted_step_ms": float(p.step_ms),
        "predicted_mfu": None if p.mfu is None else float(p.mfu),
        "predicted": predicted,
        "flows": {str(k): float(v) for k, v in p.flows.items()},
    }


REASON_BATCH = 500  # waiting reasons written per UPDATE


def write_waiting_reasons(*, reasons: Iterable[tuple[int, str]]) -> None:
    """Set each (job id, reason) waiting job's pending reason, REASON_BATCH jobs per UPDATE
    (raw SQL: an ORM CASE over hundreds of jobs costs more to build than to run, and one
    statement per job costs a round trip each). Jobs no longer waiting keep theirs."""
    rows = list(reasons)
    waiting = [status.value for status in WAITING_STATUSES]
    qn = connection.ops.quote_name
    pk, column = qn(Job._meta.pk.column), qn(Job._meta.get_field("pending_reason").column)
    status = qn(Job._meta.get_field("status").column)
    for start in range(0, len(rows), REASON_BATCH):
        batch = rows[start : start + REASON_BATCH]
        marks = ", ".join(["%s"] * len(batch))
        sql = (
            f"UPDATE {qn(Job._meta.db_table)} SET {column} = CASE {pk}"
            + " WHEN %s THEN %s" * len(batch)
            + f" END WHERE {pk} IN ({marks}) AND {status} IN ({', '.join(['%s'] * len(waiting))})"
        )
        params = [v for job_id, reason in batch for v in (job_id, reason)]
        params += [job_id for job_id, _ in batch] + waiting
        with connection.cursor() as cursor:
            cursor.execute(sql, params)


def priced_fields(
    *,
    snapshot: ClusterSnapshot,
    spec: JobSpec,
    gids: Iterable[int],
    policy: str,
    own_flows: Mapping[str, float],
) -> dict[str, Any]:
    """Job prediction fields for `spec` on `gids`, priced under the snapshot's link loads less the
    job's own flows `own_flows`."""
    load = dict(snapshot.link_load)
    for leaf, flow in own_flows.items():
        load[leaf] = max(load.get(leaf, 0.0) - float(flow), 0.0)
    gids = tuple(int(g) for g in gids)
    placement = Placement(policy, gids, evaluate(snapshot.topology, spec, gids, load))
    return prediction_fields(snapshot.topology, spec, placement)


def preview(*, cluster: Cluster, data: Any, username: str) -> dict[str, Any]:
    """Every policy's placement of a job spec on the cluster's free GPUs now (nothing booked) and
    the per-group lower bound. Costs in ms per step, MFU as a fraction. SpecError on a bad spec."""
    from apps.placement.bounds import lower_bound

    spec = load_job(prepare_submission(cluster=cluster, data=data, username=username)["spec"])
    snapshot = cluster_snapshot(cluster=cluster)
    topology = snapshot.topology
    policies = []
    for policy in POLICIES:
        result = place(topology, snapshot.free, snapshot.link_load, spec, policy=policy)
        if isinstance(result, NoFit):
            policies.append({"policy": policy, "fits": False, "reason": result.reason})
            continue
        out = placement_output(topology, spec, result)
        out["fits"] = True
        policies.append(out)
    bound = lower_bound(topology, spec)
    return {
        "job": spec.name,
        "cluster": topology.name,
        "free_gpus": int(np.count_nonzero(snapshot.free)),
        "policies": policies,
        "lower_bound": {
            "comm_ms": float(bound.comm_ms),
            "step_ms": float(bound.step_ms),
            "mfu": None if bound.mfu is None else float(bound.mfu),
        },
    }

"""The Slurm executor: keep TopoWeb's view of a Slurm cluster current and run its jobs there.

One sync (`slurm_sync`, every few seconds from celery beat or the embedded scheduler, and on
demand) reads slurmrestd's nodes and jobs and then:

1. nodes: Slurm's state and reason become the node's health (up, draining, drained, down) and its
   GRES its usable GPU count;
2. jobs TopoWeb did not submit: the GPUs they hold (GRES IDX of the detailed job record) become
   foreign allocations, out of the free set and shown on the graph;
3. TopoWeb's own Slurm jobs: their state comes back (pending with Slurm's reason, running,
   completed, failed with exit code, cancelled, node failure); on start, the GPU indexes Slurm
   granted replace the planned ones when they differ, and the placement is re-priced. Requeueing
   is TopoWeb's: a Slurm job Slurm put back in its queue (a component requeued, restarted, or
   pending again under a running job), or whose components ended apart (one failed, others run
   or wait), is cancelled whole in Slurm and its job requeued (`launch.requeue`) or failed, as
   for a node failure;
4. orphans: every live Slurm job tagged as this TopoWeb's (apps/executors/slurm/orphans.py) that is not
   the recorded Slurm job of a TopoWeb job active in that generation is cancelled (the job was
   cancelled, failed, requeued or deleted, or Slurm kept a component of it); one whose id TopoWeb
   never saved, of a job still active in that generation, is recorded instead;
5. placed jobs not yet in Slurm are submitted (one heterogeneous job pinned to the planned nodes).

Races: when a Slurm job took GPUs a placed job planned, or Slurm refuses the submission or holds
it for a reason that will not pass, the job is released and re-placed in the same sync. A job is
shown running only once Slurm runs it.
"""

from __future__ import annotations

import base64
import logging
import shlex
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.core.cache import cache
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from apps.agent.accounts import local_uid, system_account_refusal, uid_min
from apps.placement.jobs import load_job
from apps.scheduling import lifecycle
from apps.scheduling import snapshot as snap
from apps.scheduling.choices import ACTIVE_STATUSES, JobStatus, NodeState
from apps.scheduling.cycle import queue_cycle, schedule_cluster
from apps.scheduling.models import Allocation, Job, NodeHealth
from apps.scheduling.selectors import generation_master_port, rendezvous_addrs, run_as
from apps.topology.models import Cluster, Node

from ..models import ClusterExecutor, ExecutorKind, ForeignAllocation, SlurmSubmission
from . import output as rank_output
from .connect import slurm_env
from .orphans import CANCEL, Verdict, claims, judge, owner
from .rest import FINISHED_STATES, SlurmError, SlurmJob, SlurmNode, SlurmRest, group
from .script import RankSlot, granted_map, submission

log = logging.getLogger(__name__)

MAX_REFUSALS = 3  # submissions of one job Slurm refused before the job fails
LOCK_TTL_S = 60.0  # a sync that died holding the lock blocks the next ones this long at most
STOP_TIMEOUT_S = 5.0  # slurmrestd's answer to a cancel made while a user waits
# Submission states after which `_sync_submissions` looks at a submission no more.
CLOSED_STATES = (*sorted(FINISHED_STATES), "GONE", "REFUSED")

VERSION = "slurm"
# Pending reasons after which a job will not start on its planned nodes without help.
HOPELESS_REASONS = frozenset(
    {
        "ReqNodeNotAvail",
        "NodeDown",
        "BadConstraints",
        "PartitionNodeLimit",
        "PartitionConfig",
        "PartitionDown",
        "PartitionInactive",
        "InvalidAccount",
        "InvalidQOS",
        "JobHeldAdmin",
        "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions",
    }
)


@dataclass
class SyncResult:
    """What one sync did (job ids are TopoWeb's)."""

    cluster: str = ""
    nodes: int = 0
    foreign_jobs: int = 0
    submitted: list[int] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    orphans_cancelled: list[int] = field(default_factory=list)  # Slurm job ids
    recorded: list[int] = field(default_factory=list)  # Slurm job ids TopoWeb had not saved
    error: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def client_for(executor: ClusterExecutor, *, timeout: float = 15.0) -> SlurmRest:
    key = base64.b64decode(executor.jwt_key) if executor.jwt_key else b""
    return SlurmRest(
        executor.slurmrestd_url,
        user=executor.slurm_user,
        token=executor.slurm_token,
        jwt_key=key,
        timeout=timeout,
    )


def is_slurm(cluster_id: int) -> bool:
    return ClusterExecutor.objects.filter(cluster_id=cluster_id, kind=ExecutorKind.SLURM).exists()


def slurm_sync_all() -> int:
    """Sync every cluster Slurm runs (one after another); returns how many were synced."""
    n = 0
    for ex in (
        ClusterExecutor.objects.select_related("cluster").filter(kind=ExecutorKind.SLURM).order_by("pk")
    ):
        try:
            n += locked_sync(executor=ex) is not None
        except Exception:
            log.exception("slurm sync of cluster %s failed", ex.cluster.name)
    return n


def locked_sync(*, executor: ClusterExecutor) -> SyncResult | None:
    """`slurm_sync` unless another process is syncing the cluster now (beat every few seconds,
    on-demand syncs and the embedded scheduler may overlap); None when skipped."""
    key = f"executors:slurm-sync:{executor.cluster_id}"
    try:
        if not cache.add(key, 1, timeout=LOCK_TTL_S):
            return None
    except Exception:
        log.warning("no cache to serialise Slurm syncs; syncing anyway", exc_info=True)
        return slurm_sync(executor=executor)
    try:
        return slurm_sync(executor=executor)
    finally:
        cache.delete(key)


def slurm_sync(
    *, executor: ClusterExecutor, client: SlurmRest | None = None, now: datetime | None = None
) -> SyncResult:
    """One sync of the executor's cluster (see the module doc)."""
    cluster = executor.cluster
    result = SyncResult(cluster=cluster.name)
    client = client or client_for(executor)
    try:
        nodes = client.nodes()
        jobs = client.jobs()
    except SlurmError as exc:
        result.error = outage(exc, executor.last_sync_at)
        ClusterExecutor.objects.filter(pk=executor.pk).update(last_error=result.error[:2000])
        return result
    now = now or timezone.now()
    result.nodes = _sync_nodes(cluster, nodes, now)
    groups = group(jobs)
    known = _known(cluster, groups)
    ours = _our_groups(executor, groups, known)
    result.foreign_jobs = _sync_foreign(cluster, {g: c for g, c in groups.items() if g not in ours}, now)
    stopped: set[int] = set()
    _sync_submissions(executor, client, groups, result, now, stopped)
    _stop_orphans(executor, client, groups, known, result, now, stopped)
    rank_output.close_stopped(executor, now)
    _submit_placed(executor, client, nodes, result, now)
    if result.requeued:
        # Re-plan at once: the released jobs are placed again and submitted in this same sync.
        schedule_cluster(cluster=cluster)
        _submit_placed(executor, client, nodes, result, timezone.now())
    ClusterExecutor.objects.filter(pk=executor.pk).update(last_sync_at=now, last_error="")
    return result


def outage(exc: SlurmError, last_ok: datetime | None) -> str:
    """A failed listing in words that name what is down and since when (the last good sync):
    slurmrestd answering with errors means slurmctld did not answer it ("Unspecified error" is
    what 22.05 says then); no answer at all means slurmrestd is down."""
    since = f"since {last_ok.isoformat(timespec='seconds')}" if last_ok else "since before the first sync"
    if exc.errors:
        return f"controller (slurmctld) unreachable {since}: slurmrestd answered {exc}"
    if "unreachable" in str(exc):
        return f"slurmrestd unreachable {since}: {exc}"
    return str(exc)


# -- nodes -----------------------------------------------------------------------------------------


def _sync_nodes(cluster: Cluster, nodes: Iterable[SlurmNode], now: datetime) -> int:
    """Slurm's node states onto the cluster's NodeHealth rows: rows that changed are written one by
    one, the rest only get `last_seen` (one UPDATE for all), so a sync of a quiet cluster costs
    a few queries whatever its size. Returns how many of the cluster's nodes Slurm knows."""
    by_name = {n.name: n for n in nodes}
    agents = {a.node_id: a for a in NodeHealth.objects.filter(node__cluster=cluster)}
    changed = False
    count = 0
    created = []
    for node in Node.objects.filter(cluster=cluster).prefetch_related("gpus"):
        sn = by_name.get(node.name)
        indexes = sorted(g.index for g in node.gpus.all())
        if sn is None:
            state, reason, addr, gpus = NodeState.DOWN, "slurm: not a node of the Slurm cluster", "", 0
        else:
            count += 1
            state, reason, addr, gpus = sn.health, f"slurm: {sn.describe}", sn.address, sn.gpus
        unhealthy = [{"gpu": i, "reason": f"Slurm's Gres lists {gpus} GPUs"} for i in indexes if i >= gpus]
        fields = {
            "state": state,
            "reason": reason,
            "addr": addr,
            "version": VERSION,
            "inventory": [{"index": i, "uuid": "", "name": "slurm gres"} for i in range(gpus)],
            "unhealthy_gpus": unhealthy,
        }
        agent = agents.get(node.pk)
        if agent is None:
            created.append(NodeHealth(node=node, state_since=now, last_seen=now, **fields))
            changed = changed or state != NodeState.UP or bool(unhealthy)
            continue
        if all(getattr(agent, k) == v for k, v in fields.items()):
            continue
        if agent.state != state or agent.unhealthy_gpus != unhealthy:
            changed = True
        if agent.state != state or agent.state_since is None:
            fields["state_since"] = now
        NodeHealth.objects.filter(pk=agent.pk).update(**fields)
    if created:
        NodeHealth.objects.bulk_create(created)
    NodeHealth.objects.filter(node__cluster=cluster).update(last_seen=now)
    if changed:
        queue_cycle(cluster.pk)
    return count


# -- foreign jobs ----------------------------------------------------------------------------------


def _known(cluster: Cluster, groups: dict[int, list[SlurmJob]]) -> dict[int, tuple[int, int]]:
    """Slurm job id -> (TopoWeb job, generation) recorded for the Slurm jobs listed now."""
    rows = SlurmSubmission.objects.filter(job__cluster=cluster, slurm_job_id__in=list(groups)).values_list(
        "slurm_job_id", "job_id", "generation"
    )
    return {sid: (job, gen) for sid, job, gen in rows}


def _our_groups(
    executor: ClusterExecutor, groups: dict[int, list[SlurmJob]], known: dict[int, tuple[int, int]]
) -> set[int]:
    """The Slurm jobs this TopoWeb submitted: recorded, or tagged with its cluster and server."""
    name, server = executor.cluster.name, executor.server_id
    return {
        gid
        for gid, comps in groups.items()
        if gid in known or owner(comps, cluster=name, server=server, known=known) is not None
    }


def _sync_foreign(cluster: Cluster, groups: dict[int, list[SlurmJob]], now: datetime) -> int:
    """Replace the cluster's foreign allocations with the GPUs foreign jobs hold now."""
    node_ids = dict(Node.objects.filter(cluster=cluster).values_list("name", "pk"))
    want: dict[tuple[int, int], tuple[int, str, str]] = {}
    jobs = 0
    for gid, comps in groups.items():
        holding = False
        for c in comps:
            if not c.holds_gpus:
                continue
            for node, idx in c.gpus.items():
                if node not in node_ids:
                    continue
                for i in idx:
                    want[(node_ids[node], i)] = (gid, comps[0].user, comps[0].name)
                    holding = True
        jobs += holding
    have = {
        (f.node_id, f.gpu_index): (f.slurm_job_id, f.user, f.name)
        for f in ForeignAllocation.objects.filter(cluster=cluster)
    }
    if have != want:
        with transaction.atomic():
            ForeignAllocation.objects.filter(cluster=cluster).delete()
            ForeignAllocation.objects.bulk_create(
                ForeignAllocation(
                    cluster=cluster,
                    node_id=n,
                    gpu_index=i,
                    slurm_job_id=j,
                    user=u[:64],
                    name=nm[:200],
                    seen_at=now,
                )
                for (n, i), (j, u, nm) in sorted(want.items())
            )
        queue_cycle(cluster.pk)
    return jobs


def foreign_gpus(cluster_id: int) -> dict[tuple[str, int], str]:
    """(node name, GPU index) -> "slurm job N (user)" for the GPUs foreign Slurm jobs hold."""
    rows = ForeignAllocation.objects.filter(cluster_id=cluster_id).select_related("node")
    return {(f.node.name, f.gpu_index): f.label for f in rows}


# -- TopoWeb's jobs in Slurm ----------------------------------------------------------------------


def _requeue(job: Job, why: str, now: datetime) -> None:
    """Release a placed job's GPUs and put it back in the queue with `why`."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status in ACTIVE_STATUSES:
            lifecycle.requeue(job_id=job.pk, why=why, now=now)


def _cancel(client: SlurmRest, slurm_id: int, user: str | None, stopped: set[int]) -> bool:
    """Cancel Slurm job `slurm_id` (every component) as `user`; a failure is logged. True if done."""
    stopped.add(slurm_id)
    try:
        client.cancel(slurm_id, user=user or None)
        return True
    except SlurmError as exc:
        log.warning("cancel of slurm job %s failed: %s", slurm_id, exc)
        return False


def _sync_submissions(
    executor: ClusterExecutor,
    client: SlurmRest,
    groups: dict[int, list[SlurmJob]],
    result: SyncResult,
    now: datetime,
    stopped: set[int],
) -> None:
    """Bring back the state of each open submission's Slurm job; `stopped` gets the Slurm jobs
    cancelled. A submission TopoWeb no longer runs only has its state updated: the orphan pass
    cancels its Slurm job."""
    cluster = executor.cluster
    open_subs = (
        SlurmSubmission.objects.filter(job__cluster=cluster, slurm_job_id__isnull=False)
        .exclude(state__in=CLOSED_STATES)
        .select_related("job")
    )
    foreign = foreign_gpus(cluster.pk)
    running: list[tuple[Job, list[SlurmJob]]] = []
    for sub in open_subs:
        job = sub.job
        comps = groups.get(sub.slurm_job_id)
        if comps is None:
            comps = client.job(sub.slurm_job_id)
        current = job.generation == sub.generation and job.status in ACTIVE_STATUSES
        if not comps:
            SlurmSubmission.objects.filter(pk=sub.pk).update(state="GONE", updated_at=now)
            if current:
                _requeue(job, f"Slurm no longer knows its job {sub.slurm_job_id}", now)
                result.requeued.append(job.pk)
            continue
        state = _group_state(comps)
        reason = comps[0].reason
        SlurmSubmission.objects.filter(pk=sub.pk).update(state=state, reason=reason, updated_at=now)
        if not current:
            continue
        requeued, broken = _broken(comps, job.status)
        if broken:
            # Slurm put (part of) it back in its queue, or its components ended apart: it would
            # run again elsewhere than planned, or never. Stop every component; TopoWeb requeues
            # or fails the job. Any part Slurm keeps is an orphan to the next syncs.
            if any(c.live for c in comps):
                _cancel(client, sub.slurm_job_id, sub.slurm_user, stopped)
            SlurmSubmission.objects.filter(pk=sub.pk).update(state="CANCELLED", reason=broken)
            _ended(executor, job, sub, comps, "NODE_FAIL" if requeued else state, result, now, why=broken)
        elif state == "PENDING":
            _pending(job, sub, comps, foreign, client, result, now, stopped)
        elif state in ("RUNNING", "CONFIGURING", "COMPLETING"):
            running.append((job, comps))
        else:
            if state != "COMPLETED" and any(c.live for c in comps):
                # A component still completing may yet be requeued by Slurm: end it now.
                _cancel(client, sub.slurm_job_id, sub.slurm_user, stopped)
            _ended(executor, job, sub, comps, state, result, now)
    _rebind(cluster, running, result, now)
    for job, _ in running:
        if job.status == JobStatus.PLACING:
            with transaction.atomic():
                locked = Job.objects.select_for_update().get(pk=job.pk)
                if lifecycle.start(job=locked, now=now):
                    result.started.append(job.pk)
        # Once its map is final: each rank a run, its output stored as Slurm's task writes it.
        lifecycle.ranks_running(job=job, generation=job.generation, now=now)
        rank_output.ship(executor, job, job.generation)


def _broken(comps: list[SlurmJob], status: str) -> tuple[bool, str]:
    """(requeued, why) when a TopoWeb job's Slurm job can no longer run as planned, (False, "")
    while it can. Requeued: Slurm put a component back in its queue (requeue state, restart
    count, or pending again under a job TopoWeb saw run). Otherwise broken when a component
    ended other than completed while another still waits or runs."""
    requeued = [c for c in comps if c.requeued or (c.state == "PENDING" and status == JobStatus.RUNNING)]
    if requeued:
        parts = ", ".join(f"{c.job_id} {c.state.lower()}" for c in requeued)
        return True, f"Slurm requeued it ({parts})"
    bad = [c for c in comps if c.state in FINISHED_STATES and c.state != "COMPLETED"]
    if bad and any(c.live and c.state != "COMPLETING" for c in comps):
        parts = ", ".join(f"{c.job_id} {c.state.lower()}" for c in bad)
        return False, f"its components ended apart ({parts})"
    return False, ""


def _group_state(comps: list[SlurmJob]) -> str:
    states = {c.state for c in comps}
    for s in (
        "NODE_FAIL",
        "FAILED",
        "OUT_OF_MEMORY",
        "TIMEOUT",
        "BOOT_FAIL",
        "DEADLINE",
        "CANCELLED",
        "PREEMPTED",
    ):
        if s in states:
            return s
    for s in ("RUNNING", "CONFIGURING", "COMPLETING", "PENDING", "SUSPENDED", "REQUEUED"):
        if s in states:
            return s
    return comps[0].state


def _planned(job: Job) -> list[tuple[int, str, int]]:
    return list(
        Allocation.objects.filter(job=job, generation=job.generation, live=True)
        .order_by("rank")
        .values_list("rank", "gpu__node__name", "gpu_index")
    )


def _pending(job, sub, comps, foreign, client, result, now, stopped) -> None:
    planned = _planned(job)
    taken = [(n, g) for _, n, g in planned if (n, g) in foreign]
    why = ""
    if taken and _shift(job, foreign):
        log.info(
            "job %s: %s took planned GPUs %s first; moved to free GPUs of the same nodes",
            job.pk,
            foreign[taken[0]],
            taken,
        )
        return
    if taken:
        node, gpu = taken[0]
        why = f"{foreign[(node, gpu)]} took planned GPU {gpu} on node {node} first; re-placing"
    elif comps[0].reason in HOPELESS_REASONS:
        why = f"Slurm holds job {sub.slurm_job_id} pending ({comps[0].reason}); re-placing"
    if why:
        _cancel(client, sub.slurm_job_id, sub.slurm_user, stopped)
        SlurmSubmission.objects.filter(pk=sub.pk).update(state="CANCELLED", reason=why)
        _requeue(job, why, now)
        result.requeued.append(job.pk)
        return
    reason = comps[0].reason
    text = f"slurm job {sub.slurm_job_id} pending" + (f" ({reason})" if reason and reason != "None" else "")
    if job.pending_reason != text:
        Job.objects.filter(pk=job.pk, status=JobStatus.PLACING).update(pending_reason=text)


def _priced(snapshot, job: Job, gids: list[int]) -> tuple[Job, list[int], dict]:
    """(job, gids, its prediction fields on those GPUs) for `lifecycle.rebind`."""
    fields = snap.priced_fields(
        snapshot=snapshot,
        spec=load_job(job.spec),
        gids=gids,
        policy=job.placed_policy or "topo",
        own_flows=job.flows or {},
    )
    fields.pop("placed_policy", None)
    return job, gids, fields


def _shift(job: Job, foreign: dict[tuple[str, int], str]) -> bool:
    """Move the ranks of a job Slurm holds pending whose planned GPUs a foreign job took onto
    GPUs free on the same nodes (Slurm's request names nodes and counts, not indexes, so the
    Slurm job stands and nothing is cancelled). False when a node lacks free GPUs: Slurm cannot
    start it there now either, and the caller re-places it."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status != JobStatus.PLACING:
            return False
        planned = _planned(job)
        snapshot = snap.cluster_snapshot(cluster=job.cluster)
        topo = snapshot.topology
        gids = []
        spare: dict[str, list[int]] = {}
        for _, node, gpu in planned:
            if (node, gpu) not in foreign:
                gids.append(topo.gid(node, gpu))
                continue
            if node not in spare:
                i = topo.node_by_name[node]
                first = int(topo.node_first_gid[i])
                spare[node] = [
                    g
                    for g in range(first, first + int(topo.node_gpu_count[i]))
                    if snapshot.free[g] and topo.gpu_key(g) not in foreign
                ]
            if not spare[node]:
                return False
            gids.append(spare[node].pop(0))
        lifecycle.rebind(snapshot=snapshot, moves=[_priced(snapshot, job, gids)])
    return True


def _granted(comps: list[SlurmJob]) -> dict[str, list[int]]:
    granted: dict[str, list[int]] = {}
    for c in comps:
        for node, idx in c.gpus.items():
            granted.setdefault(node, []).extend(idx)
    return granted


def _rebind(
    cluster: Cluster, running: list[tuple[Job, list[SlurmJob]]], result: SyncResult, now: datetime
) -> list[int]:
    """Record the GPUs Slurm granted the jobs it runs (`running`: job and its Slurm records) where
    they differ from the plan, and re-price those jobs; returns their ids.

    Slurm cannot be asked for GPU indexes, only counts per node, so it may grant others than
    planned. The task wrappers bind ranks to the granted GPUs themselves (`granted_map`, the same
    rule) before the command starts, so what the ranks compute on is final at start: the server
    only records it. A job Slurm has started is never stopped for it. All the jobs are moved at
    once (two jobs Slurm gave each other's planned GPUs swap); a job that is not running in Slurm
    and planned on a granted GPU is re-placed (its Slurm job, if any, has not started). Should a
    granted GPU be held by a job that is running but not in this listing, the grant is left
    unrecorded this sync (logged) rather than stop that job."""
    moves: dict[int, dict[int, tuple[str, int]]] = {}
    for job, comps in running:
        planned = _planned(job)
        actual = granted_map(planned, _granted(comps))
        if actual is not None and any(actual[r] != (n, g) for r, n, g in planned):
            moves[job.pk] = actual
    if not moves:
        return []
    in_slurm = {job.pk for job, _ in running}
    with transaction.atomic():
        jobs = list(
            Job.objects.select_for_update()
            .filter(pk__in=list(moves), status__in=ACTIVE_STATUSES)
            .order_by("pk")
        )
        snapshot = snap.cluster_snapshot(cluster=cluster)
        topo = snapshot.topology
        gids = {j.pk: [topo.gid(*moves[j.pk][r]) for r in sorted(moves[j.pk])] for j in jobs}
        mover = {snapshot.index.gpu_pk[g]: pk for pk, gs in gids.items() for g in gs}
        holders = (
            Allocation.objects.filter(live=True, gpu_id__in=list(mover))
            .exclude(job_id__in=list(gids))
            .values_list("job_id", "gpu_id")
        )
        started = set(
            Job.objects.filter(pk__in={o for o, _ in holders}, status=JobStatus.RUNNING).values_list(
                "pk", flat=True
            )
        )
        keep = set()
        stale = set()
        for other, gpu_pk in holders:
            if other in in_slurm or other in started:
                keep.add(mover[gpu_pk])
                log.warning(
                    "job %s: Slurm granted a GPU running job %s holds; its grant is recorded later",
                    mover[gpu_pk],
                    other,
                )
            else:
                stale.add(other)
        # A job kept on its plan keeps its GPUs: a job moving onto them waits too.
        holding: dict[int, set[int]] = {}
        for pk, gpu_pk in Allocation.objects.filter(live=True, job_id__in=list(gids)).values_list(
            "job_id", "gpu_id"
        ):
            holding.setdefault(pk, set()).add(gpu_pk)
        while True:
            kept = set().union(*(holding.get(pk, set()) for pk in keep))
            more = {
                pk
                for pk in gids
                if pk not in keep and any(snapshot.index.gpu_pk[g] in kept for g in gids[pk])
            }
            if not more:
                break
            keep |= more
        for other in Job.objects.filter(pk__in=stale).order_by("pk"):
            # Not started anywhere: its plan on a GPU Slurm runs another job on is stale.
            _requeue(other, "Slurm granted its planned GPUs to a running job; re-placing", now)
            result.requeued.append(other.pk)
        moved = [_priced(snapshot, job, gids[job.pk]) for job in jobs if job.pk not in keep]
        lifecycle.rebind(snapshot=snapshot, moves=moved)
    for job, _, _ in moved:
        log.info("job %s: recorded the GPUs Slurm granted (%s)", job.pk, moves[job.pk])
    if moved:
        queue_cycle(cluster.pk)
    return [job.pk for job, _, _ in moved]


def _ended(executor, job, sub, comps, state, result, now, why: str = "") -> None:
    """The job ended in Slurm in `state` (`why`: TopoWeb stopped it there, and why): its ranks'
    output is stored and their runs exit first, so that ending the job releases every GPU."""
    code, cause = rank_output.exit_of(state, comps)
    rank_output.ranks_ended(executor, job, sub.generation, exit_code=code, cause=cause, now=now)
    jid = sub.slurm_job_id
    stop = f"; cancelled in Slurm: {why}" if why else ""
    if state == "COMPLETED":
        status, why = JobStatus.COMPLETED, ""
    elif state == "CANCELLED":
        status, why = JobStatus.CANCELLED, f"slurm job {jid} was cancelled in Slurm{stop}"
    elif state == "NODE_FAIL":
        down = ", ".join(sorted({n for c in comps for n in c.nodes}))
        why = f"slurm job {jid}: node failure ({down}){stop}"
        if load_job(job.spec).launch.requeue:
            _requeue(job, why, now)
            result.requeued.append(job.pk)
            return
        status = JobStatus.FAILED
    elif state == "TIMEOUT" and job.time_limit_min is not None:
        status, why = JobStatus.FAILED, job.time_limit_reason(f"Slurm job {jid}: TIMEOUT")
    else:
        code = next((c.exit_code for c in comps if c.exit_code), None)
        sig = next((c.signal for c in comps if c.signal), None)
        how = f"exit code {code}" if code is not None else (f"signal {sig}" if sig else "no exit code")
        status, why = JobStatus.FAILED, f"slurm job {jid} {state.lower()}: {how} ({comps[0].reason}){stop}"
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status in ACTIVE_STATUSES:
            lifecycle.finish(job=job, status=status, reason=why, now=now)
            result.finished.append(job.pk)


# -- orphans ---------------------------------------------------------------------------------------


def _verdicts(
    executor: ClusterExecutor,
    groups: dict[int, list[SlurmJob]],
    known: dict[int, tuple[int, int]],
    skip: set[int] | frozenset[int] = frozenset(),
) -> list[Verdict]:
    """The orphan verdicts on the listed Slurm jobs (apps/executors/slurm/orphans.py); two queries
    when TopoWeb has a live Slurm job, none otherwise."""
    claimed = claims(groups, cluster=executor.cluster.name, server=executor.server_id, known=known, skip=skip)
    if not claimed:
        return []
    ids = {c.job_id for c in claimed}
    jobs = {
        pk: (status, gen)
        for pk, status, gen in Job.objects.filter(cluster_id=executor.cluster_id, pk__in=ids).values_list(
            "pk", "status", "generation"
        )
    }
    subs = {
        (job, gen): sid
        for job, gen, sid in SlurmSubmission.objects.filter(job_id__in=ids).values_list(
            "job_id", "generation", "slurm_job_id"
        )
    }
    return judge(claimed, jobs=jobs, subs=subs, active=ACTIVE_STATUSES)


def slurm_orphans(executor: ClusterExecutor, client: SlurmRest | None = None) -> list[dict]:
    """This TopoWeb's live Slurm jobs on the executor's cluster that no active TopoWeb job holds,
    without acting: one dict each with `slurm_id`, `job_id` (the TopoWeb job its tag names),
    `generation`, `state` (its components' Slurm states), `action` ("cancel": an orphan the next
    sync cancels; "record": an active job's Slurm job whose id TopoWeb never saved, which the
    next sync records), `why` and `user`. SlurmError when slurmrestd cannot list the jobs."""
    client = client or client_for(executor)
    groups = group(client.jobs())
    return [v.as_dict() for v in _verdicts(executor, groups, _known(executor.cluster, groups))]


def _stop_orphans(
    executor: ClusterExecutor,
    client: SlurmRest,
    groups: dict[int, list[SlurmJob]],
    known: dict[int, tuple[int, int]],
    result: SyncResult,
    now: datetime,
    stopped: set[int],
) -> None:
    """Cancel the orphans among the listed Slurm jobs (not those this sync already cancelled) and
    record the Slurm jobs of active jobs TopoWeb had not saved."""
    for v in _verdicts(executor, groups, known, skip=stopped):
        what = f"slurm job {v.slurm_id} (TopoWeb job {v.job_id} generation {v.generation}, {v.state})"
        if v.action != CANCEL:
            _record(executor, v, now)
            log.warning("recorded %s: %s", what, v.why)
            result.recorded.append(v.slurm_id)
            continue
        # As the user it was submitted as: recorded, else the one Slurm names when TopoWeb submits
        # as owners (otherwise TopoWeb's own Slurm user submitted it).
        user = (
            SlurmSubmission.objects.filter(slurm_job_id=v.slurm_id, job_id=v.job_id)
            .values_list("slurm_user", flat=True)
            .first()
        ) or (v.user if executor.submit_as_owner else "")
        if _cancel(client, v.slurm_id, user, stopped):
            log.warning("cancelled orphan %s: %s", what, v.why)
            result.orphans_cancelled.append(v.slurm_id)
            if v.job_id is not None and v.job_id not in result.cancelled:
                result.cancelled.append(v.job_id)


def _record(executor: ClusterExecutor, v: Verdict, now: datetime) -> None:
    """Save the Slurm job id of an active job's generation that TopoWeb never saved."""
    user = v.user if executor.submit_as_owner else ""
    sub, created = SlurmSubmission.objects.get_or_create(
        job_id=v.job_id,
        generation=v.generation,
        defaults={
            "slurm_job_id": v.slurm_id,
            "slurm_user": user,
            "state": "PENDING",
            "submitted_at": now,
            "updated_at": now,
        },
    )
    if not created:
        SlurmSubmission.objects.filter(pk=sub.pk, slurm_job_id__isnull=True).update(
            slurm_job_id=v.slurm_id, slurm_user=user, state="PENDING", reason="", updated_at=now
        )
    Job.objects.filter(pk=v.job_id, status=JobStatus.PLACING, generation=v.generation).update(
        pending_reason=f"submitted to Slurm as job {v.slurm_id}"
    )


# -- submission ------------------------------------------------------------------------------------


def _submit_placed(
    executor: ClusterExecutor, client: SlurmRest, nodes: list[SlurmNode], result: SyncResult, now
) -> None:
    cluster = executor.cluster
    done = SlurmSubmission.objects.filter(job_id=OuterRef("pk"), generation=OuterRef("generation"))
    placed = (
        Job.objects.filter(cluster=cluster, status=JobStatus.PLACING)
        .exclude(Exists(done))
        .select_related("owner")
        .order_by("pk")
    )
    if not placed:
        return
    foreign = foreign_gpus(cluster.pk)
    all_nodes = [n.name for n in nodes]
    for job in placed:
        _submit_one(executor, client, job, foreign, all_nodes, result, now)


def _submit_one(executor, client, job, foreign, all_nodes, result, now) -> None:
    rows = list(
        Allocation.objects.filter(job=job, generation=job.generation, live=True)
        .order_by("rank")
        .values_list("rank", "gpu__node__name", "gpu_index", "nic_name")
    )
    if len(rows) != job.gpus:
        return
    taken = [(n, g) for _, n, g, _ in rows if (n, g) in foreign]
    if taken:
        node, gpu = taken[0]
        _requeue(job, f"{foreign[(node, gpu)]} holds planned GPU {gpu} on node {node}; re-placing", now)
        result.requeued.append(job.pk)
        return
    spec = load_job(job.spec)
    launch = spec.launch
    slots = [RankSlot(r, n, g, nic) for r, n, g, nic in rows]
    user = (
        run_as(user_id=job.owner_id, username=job.owner.get_username()) if executor.submit_as_owner else None
    )
    why = owner_refusal(executor, user or "")
    if why:
        # Mapped (or unmapped) since it was submitted: never hand Slurm a job for a user it would
        # run as nobody, or as root.
        with transaction.atomic():
            locked = Job.objects.select_for_update().get(pk=job.pk)
            if locked.status in ACTIVE_STATUSES:
                lifecycle.finish(job=locked, status=JobStatus.FAILED, reason=f"owner: {why}", now=now)
                result.finished.append(job.pk)
        return
    workdir = launch.workdir or executor.output_dir or "/tmp"
    output = ""
    if executor.output_dir:
        output = f"{executor.output_dir.rstrip('/')}/topoweb-{job.pk}-{job.generation}-%j.out"
    try:
        body = submission(
            cluster=job.cluster.name,
            job_id=job.pk,
            generation=job.generation,
            name=job.name,
            slots=slots,
            command=list(launch.command) or ["true"],
            env=dict(launch.env),
            workdir=workdir,
            # The rank map's MASTER_ADDR: rank 0's node's address as Slurm reports it (NodeAddr).
            master_addr=rendezvous_addrs(cluster_id=job.cluster_id, nodes=[rows[0][1]])[rows[0][1]],
            master_port=generation_master_port(job.pk, job.generation),
            all_nodes=all_nodes,
            partition=executor.partition,
            output=output,
            time_limit_min=launch.time_limit_min,
            server=executor.server_id,
            log_dir=str(rank_output.log_dir(executor, job)),
        )
        slurm_id = client.submit(body, user=user)
    except (SlurmError, ValueError) as exc:
        SlurmSubmission.objects.update_or_create(
            job=job, generation=job.generation, defaults={"state": "REFUSED", "reason": str(exc)[:2000]}
        )
        refusals = SlurmSubmission.objects.filter(job=job, state="REFUSED").count()
        if isinstance(exc, ValueError) or _refuses_user(exc) or refusals >= MAX_REFUSALS:
            # Placing it elsewhere cannot help: the spec, the user or Slurm itself is the problem.
            who = f" as Slurm user {user!r}" if user and _refuses_user(exc) else ""
            with transaction.atomic():
                locked = Job.objects.select_for_update().get(pk=job.pk)
                if locked.status in ACTIVE_STATUSES:
                    lifecycle.finish(
                        job=locked,
                        status=JobStatus.FAILED,
                        reason=f"Slurm refused the job{who}: {exc}",
                        now=now,
                    )
                    result.finished.append(job.pk)
            return
        _requeue(job, f"Slurm refused the submission: {exc}; re-placing", now)
        result.requeued.append(job.pk)
        return
    SlurmSubmission.objects.update_or_create(
        job=job,
        generation=job.generation,
        defaults={
            "slurm_job_id": slurm_id,
            "slurm_user": user or "",
            "state": "PENDING",
            "submitted_at": now,
            "updated_at": now,
        },
    )
    Job.objects.filter(pk=job.pk, status=JobStatus.PLACING).update(
        pending_reason=f"submitted to Slurm as job {slurm_id}"
    )
    result.submitted.append(job.pk)


def owner_refusal(executor: ClusterExecutor, account: str) -> str:
    """Why the executor's Slurm cannot run a job as Unix account `account` ("" when it can, and
    always when it does not submit as owners: then every job runs as TopoWeb's Slurm user).

    Slurm's auth/jwt takes any user name a token signed with the cluster's key names, and
    slurmctld accepts a job for a name it cannot resolve (it runs it as nobody): so TopoWeb
    checks the name against the accounts of its own host, which must see the cluster's accounts
    (the same directory, e.g. LDAP or sssd), as `manage.py unix_account` does when it maps one.
    Root and system accounts (below UID_MIN) are refused as the node agents refuse them."""
    if not executor.submit_as_owner:
        return ""
    where = f"the Slurm cluster of {executor.cluster.name}"
    uid = 0 if account == "root" else local_uid(account)
    if uid is None:
        return (
            f"no Unix account {account!r} on {where} (checked on the TopoWeb host, which sees the"
            " cluster's accounts): Slurm would run the job as nobody. Map the user to their Unix"
            " account (manage.py unix_account USER NAME) or have the account made"
        )
    why = system_account_refusal(account, uid, uid_min())
    return f"{why}; Slurm runs each job of {where} as its owner" if why else ""


def _refuses_user(exc: Exception) -> bool:
    """Whether Slurm's refusal is about who submits (no such user, bad or expired token)."""
    text = str(exc).lower()
    return any(
        k in text
        for k in ("invalid user", "user id", "authentication", "access denied", "permission denied", "token")
    )


def stop_job(job: Job) -> list[int]:
    """Cancel `job`'s Slurm jobs now, once TopoWeb has stopped the job (the next sync's orphan
    pass would otherwise): each of its recorded Slurm jobs not known to have ended. Errors are
    logged, never raised (the orphan pass stops whatever this misses). Returns the Slurm job ids
    cancelled; [] for a job not on a Slurm cluster. Costs one slurmrestd call per Slurm job, at
    most STOP_TIMEOUT_S each."""
    try:
        ex = ClusterExecutor.objects.filter(cluster_id=job.cluster_id, kind=ExecutorKind.SLURM).first()
        if ex is None:
            return []
        subs = list(
            SlurmSubmission.objects.filter(job_id=job.pk, slurm_job_id__isnull=False)
            .exclude(state__in=("COMPLETED", "GONE"))
            .values_list("slurm_job_id", "slurm_user")
        )
        if not subs:
            return []
        client = client_for(ex, timeout=STOP_TIMEOUT_S)
    except Exception:
        log.exception("stopping the Slurm jobs of job %s failed", job.pk)
        return []
    stopped: set[int] = set()
    return [sid for sid, user in subs if _cancel(client, sid, user, stopped)]


SCONTROL_TIMEOUT_S = 20.0


def set_node_state(executor: ClusterExecutor, node: str, state: str, reason: str = "") -> None:
    """Drain (with `reason`) or resume `node` in Slurm with `scontrol update` when the executor's
    `scontrol_nodes` allows it (slurmrestd v0.0.38 has no node update call); the next sync reads
    Slurm's state back. `executor.Refused` otherwise, or when scontrol fails, with its words and
    the command to run in Slurm."""
    from apps.scheduling.executor import Refused

    words = [f"nodename={node}", f"state={state}"]
    if state == "drain":
        words.append(f"reason={reason or 'drained in TopoWeb'}")
    how = "scontrol update " + " ".join(shlex.quote(w) for w in words)
    if not executor.scontrol_nodes:
        raise Refused(
            f"node states of cluster {executor.cluster.name} are Slurm's: run `{how}` on the Slurm"
            " cluster (TopoWeb follows at its next sync), or let TopoWeb run it (the cluster"
            " executor's scontrol_nodes, on a host with Slurm's commands)"
        )
    try:
        done = subprocess.run(
            ["scontrol", "update", *words],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            env=slurm_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Refused(f"could not run `{how}`: {exc}") from exc
    if done.returncode != 0:
        raise Refused(f"`{how}` failed: {(done.stderr or done.stdout).strip()[:500]}")

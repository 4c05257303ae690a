"""The scheduling cycle service: lock the cluster, snapshot, plan, commit, audit.

Everything a cycle writes happens in one transaction under a row lock on the cluster
(`select_for_update`), so workers on any number of hosts never book the same GPU and a cycle
that dies half-way leaves nothing half-booked. SQLite ignores `select_for_update`; there the
cycles of one process run in a single lane (a per-cluster thread lock), status changes are
conditional updates, and the unique live-allocation constraint is the last guard.

Every submission and release requests a cycle. With a broker and a shared cache, requests made
while a cycle is queued but has not taken its snapshot yet are folded into that cycle, so a burst
of submissions costs a few cycles, not one each. A worker starts a cluster's next cycle at least
MIN_CYCLE_GAP_S after its last one ended, so under a burst each cycle takes everything submitted
meanwhile; a request after a quiet spell runs at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from apps.placement.planner import CyclePlan, plan_cycle
from apps.topology.models import Cluster

from . import accounts, lifecycle
from . import snapshot as snap
from .choices import CycleStatus, JobStatus
from .models import Job, SchedulingCycle
from .occupancy import CycleOccupancy
from .occupancy import forget as forget_occupancy

log = logging.getLogger(__name__)

PENDING_TTL_S = 5  # a lost cycle request folds new ones into itself at most this long
MIN_CYCLE_GAP_S = 0.1  # a burst costs one cycle per cluster per this long, not one per arrival
_LAST_END: dict[int, float] = {}
_LANES: dict[int, threading.Lock] = {}
_LANES_LOCK = threading.Lock()


@contextmanager
def scheduling_lane(cluster_id: int):
    """Serialise this process's cycles on one cluster where the database cannot lock rows."""
    if connection.vendor != "sqlite":
        yield
        return
    with _LANES_LOCK:
        lane = _LANES.setdefault(cluster_id, threading.Lock())
    with lane:
        yield


def _pending_key(cluster_id: int) -> str:
    # The database name keeps deployments (and test runs) that share one cache apart.
    return f"topoweb:{connection.settings_dict['NAME']}:cycle-pending:{cluster_id}"


def coalescing() -> bool:
    """True when cycle requests are coalesced: tasks go to a broker and every process shares the
    cache (a local-memory cache cannot tell a worker's cycle from a web process's request)."""
    from .tasks import schedule_cluster_task

    backend = settings.CACHES["default"]["BACKEND"].lower()
    return not schedule_cluster_task.app.conf.task_always_eager and not any(
        local in backend for local in ("locmem", "dummy")
    )


def cycles_run_inline() -> bool:
    """True when a requested cycle runs in the requesting process (no broker: embedded, tests)."""
    from .tasks import schedule_cluster_task

    return bool(schedule_cluster_task.app.conf.task_always_eager)


def request_cycle(cluster_id: int, *, coalesce: bool = True) -> bool:
    """Queue a scheduling cycle for the cluster now, unless one is queued and has not yet taken
    its snapshot (that one will see everything committed before this call). `coalesce=False`
    (beat) queues one regardless, so a request lost with its worker cannot hold scheduling back.
    Returns whether a task was queued; a broker that refuses the task is logged, not raised: the
    jobs stay queued in the database and beat's next request picks them up."""
    from .tasks import schedule_cluster_task

    key = _pending_key(cluster_id)
    if coalescing():
        try:
            if coalesce and not cache.add(key, 1, timeout=PENDING_TTL_S):
                return False
            if not coalesce:
                cache.set(key, 1, timeout=PENDING_TTL_S)
        except Exception:
            # Without the cache, queue anyway: an extra cycle is harmless, a missing one is not.
            log.warning("cycle coalescing unavailable for cluster %s", cluster_id, exc_info=True)
    try:
        schedule_cluster_task.delay(cluster_id)
    except BrokerUnavailable as exc:
        log.warning("could not queue a cycle for cluster %s, beat will: %s", cluster_id, exc)
        _clear_request(cluster_id)
        return False
    return True


def _clear_request(cluster_id: int) -> None:
    """Called under the cluster lock before the snapshot: requests made from now on need a new cycle."""
    if coalescing():
        try:
            cache.delete(_pending_key(cluster_id))
        except Exception:
            log.warning("could not clear the cycle request of cluster %s", cluster_id, exc_info=True)


_COLLECTING = threading.local()


def queue_cycle(cluster_id: int) -> None:
    """Request a scheduling cycle for the cluster once the current transaction commits (or, under
    `requests_deferred`, collect the request for its caller to send)."""
    # robust: a failing eager cycle is logged and audited, it must not fail the caller's request.
    transaction.on_commit(lambda: _request_or_collect(cluster_id), robust=True)


def _request_or_collect(cluster_id: int) -> None:
    collected = getattr(_COLLECTING, "clusters", None)
    if collected is None:
        request_cycle(cluster_id)
    else:
        collected.add(cluster_id)


@contextmanager
def requests_deferred(defer: Callable[[Callable[[], None]], None]):
    """The cycle requests this thread's commits make inside the block are collected, not sent, and
    at its end (raised or not) handed to `defer` as one callable that sends them (one per
    cluster): a web view passes them on to run once its write slot is free. Only where requests
    go to a broker: where a cycle runs in the requesting process, it runs on commit as always."""
    if cycles_run_inline() or getattr(_COLLECTING, "clusters", None) is not None:
        yield
        return
    clusters: set[int] = set()
    _COLLECTING.clusters = clusters
    try:
        yield
    finally:
        _COLLECTING.clusters = None
        if clusters:
            defer(lambda: _request_each(sorted(clusters)))


def _request_each(cluster_ids: list[int]) -> None:
    for cluster_id in cluster_ids:
        try:
            request_cycle(cluster_id)
        except Exception:
            log.exception("could not request a cycle for cluster %s", cluster_id)


def schedule_requested(*, cluster: Cluster) -> SchedulingCycle:
    """Run a requested cycle on `cluster` (what a worker does with a request).

    When requests are coalesced, a cycle that follows this process's last cycle on the cluster by
    less than MIN_CYCLE_GAP_S seconds first waits out the rest: requests made meanwhile fold into it.
    """
    if coalescing():
        wait_s = _LAST_END.get(cluster.pk, float("-inf")) + MIN_CYCLE_GAP_S - time.monotonic()
        if wait_s > 0:
            time.sleep(wait_s)
    try:
        return schedule_cluster(cluster=cluster)
    finally:
        _LAST_END[cluster.pk] = time.monotonic()


class _Stages:
    """Wall time of a cycle's stages: call with a stage's name when it ends."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = (now - self._last) * 1000.0
        self._last = now


@dataclass(frozen=True)
class CycleCost:
    """Where the last cycle on a cluster in this process spent its time (ms per stage: lock,
    snapshot, queue, rank, plan, commit, audit, keep) and whether it read the occupancy whole
    or only the `jobs_read` jobs that changed."""

    stages_ms: dict[str, float]
    read_whole: bool
    jobs_read: int


LAST_CYCLE: dict[int, CycleCost] = {}


LOST_PREFIX = "WorkerLost:"
LOST_RETRY_LIMIT = 3  # redelivered cycles of one cluster retried at once per LOST_WINDOW_S
LOST_WINDOW_S = 60.0


def cycle_record_redelivered(*, cluster: Cluster) -> bool:
    """Audit a cycle request that the broker delivered again (the worker that took it died or
    stopped before finishing it; the cycle it may have begun committed nothing). Returns whether
    to retry it now: not when LOST_RETRY_LIMIT such losses on the cluster already happened within
    LOST_WINDOW_S, so a cycle that kills its worker every time cannot loop; beat tries again."""
    since = timezone.now() - timedelta(seconds=LOST_WINDOW_S)
    recent = SchedulingCycle.objects.filter(
        cluster=cluster, status=CycleStatus.FAILED, error__startswith=LOST_PREFIX, started_at__gte=since
    ).count()
    retry = recent < LOST_RETRY_LIMIT
    SchedulingCycle.objects.create(
        cluster=cluster,
        policy=cluster.policy,
        status=CycleStatus.FAILED,
        error=f"{LOST_PREFIX} the worker running this cycle died or stopped before finishing it; "
        + (
            "the request was delivered again and its retry follows"
            if retry
            else f"not retried at once ({recent + 1} losses within {LOST_WINDOW_S:.0f} s), beat retries"
        ),
    )
    if not retry:
        log.error("cycles on cluster %s keep losing their worker; leaving the retry to beat", cluster.pk)
    return retry


def schedule_cluster(*, cluster: Cluster) -> SchedulingCycle:
    """Run one scheduling cycle on `cluster` and return its audit record.

    Places waiting jobs by priority then age (gangs all-or-nothing, EASY backfill, preemption
    when the cluster allows it), flags running jobs past twice their estimate, records why every
    job left waiting waits. A job whose evaluation raises (or whose stored spec no longer loads)
    is marked failed with the reason and the others are planned as if it were not there. On any
    other error nothing is booked, a failed cycle is recorded and the error re-raised.
    """
    started = timezone.now()
    t0 = time.perf_counter()
    with scheduling_lane(cluster.pk):
        try:
            with transaction.atomic():
                stage = _Stages()
                # FOR NO KEY UPDATE: exclusive among cycles, repricing and migrations, but not
                # against the key-share lock each job INSERT takes on its cluster's row (FOR
                # UPDATE held every submission until the cycle committed).
                locked = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
                _clear_request(locked.pk)
                now = timezone.now()
                stage("lock")
                occupancy = CycleOccupancy(cluster=locked)
                snapshot = occupancy.snapshot
                stage("snapshot")
                unreadable: dict[int, str] = {}
                waiting = snap.queued_jobs(cluster=locked, unreadable=unreadable)
                queue, held_back = _held_back(occupancy, waiting)
                stage("queue")
                quotas, qos = accounts.rank_jobs(cluster=locked, snapshot=snapshot, queue=queue, now=now)
                stage("rank")
                plan = plan_cycle(
                    snapshot,
                    queue,
                    cluster_policy=locked.policy,
                    backfill=locked.backfill_enabled,
                    preemption=locked.preemption_enabled,
                    now=now,
                    quotas=quotas,
                    qos=qos,
                )
                stage("plan")
                plan.waiting.update(held_back)
                failed = lifecycle.fail_unscheduled({**unreadable, **plan.failed}, now)
                placed, preempted = _commit(snapshot, plan, waiting, now)
                stage("commit")
                record = SchedulingCycle.objects.create(
                    cluster=locked,
                    started_at=started,
                    policy=locked.policy,
                    duration_ms=(time.perf_counter() - t0) * 1000.0,
                    placed=len(placed),
                    placed_jobs=placed,
                    preempted_jobs=preempted,
                    skipped={str(k): v for k, v in plan.waiting.items()},
                    failed_jobs={str(k): v for k, v in failed.items()},
                    status=CycleStatus.COMPLETED,
                )
                stage("audit")
                occupancy.finish()
                stage("keep")
            LAST_CYCLE[cluster.pk] = CycleCost(
                stages_ms=stage.ms,
                read_whole=occupancy.read_whole,
                jobs_read=occupancy.jobs_read,
            )
            return record
        except Cluster.DoesNotExist:
            forget_occupancy(cluster.pk)
            raise
        except Exception as exc:
            forget_occupancy(cluster.pk)
            log.exception("scheduling cycle on cluster %s failed", cluster.pk)
            if Cluster.objects.filter(pk=cluster.pk).exists():
                SchedulingCycle.objects.create(
                    cluster_id=cluster.pk,
                    started_at=started,
                    policy=cluster.policy,
                    duration_ms=(time.perf_counter() - t0) * 1000.0,
                    status=CycleStatus.FAILED,
                    error=f"{type(exc).__name__}: {exc}"[:4000],
                )
            raise


def _book(snapshot: snap.ClusterSnapshot, plan: CyclePlan, now: datetime) -> list[int]:
    """Write the plan's bookings in a few statements; returns the ids of the jobs placed."""
    return lifecycle.place(
        snapshot=snapshot,
        bookings=[
            lifecycle.Booking(
                b.job.job_id,
                tuple(int(g) for g in b.placement.gids),
                {
                    **snap.prediction_fields(snapshot.topology, b.job.spec, b.placement),
                    "borrowed": b.borrowed,
                },
            )
            for b in plan.bookings
        ],
        now=now,
    )


def _held_back(
    occupancy: CycleOccupancy, queue: list[snap.QueuedJob]
) -> tuple[list[snap.QueuedJob], dict[int, str]]:
    """The queue without the jobs whose previous generation still has ranks holding GPUs (they are
    placed again only once those are gone), and why each of those waits."""
    topo = occupancy.snapshot.topology
    waiting: dict[int, str] = {}
    for q in queue:
        hold = occupancy.holds.get(q.job_id)
        if hold is None or not any(hold.ranks.values()):
            continue
        per_node: dict[str, int] = {}
        for gids in hold.ranks.values():
            for g in gids:
                name = topo.nodes[int(topo.gpu_node[g])].name
                per_node[name] = per_node.get(name, 0) + 1
        waiting[q.job_id] = lifecycle.still_stopping(per_node)
    return [q for q in queue if q.job_id not in waiting], waiting


def _commit(
    snapshot: snap.ClusterSnapshot, plan: CyclePlan, queue: list[snap.QueuedJob], now: datetime
) -> tuple[list[int], list[int]]:
    """Write a plan: evictions, bookings, overdue flags, waiting reasons. Returns the ids of the
    jobs placed and preempted. A victim whose ranks run under agents is only told to stop here:
    its GPUs stay allocated until its agents report every rank's exit (`lifecycle.requeue`
    keeps those), and its preemptor waits for them in the plan."""
    preempted: list[int] = []
    for ev in plan.evictions:
        jid = ev.victim.job_id
        why = f"preempted by job {ev.by_job} (priority {ev.by_priority})"
        if ev.reclaimed_for:
            why = f"reclaimed by job {ev.by_job} of account {ev.reclaimed_for}: it ran on borrowed GPUs"
        elif ev.why:
            why = ev.why
        if lifecycle.requeue(
            job_id=jid,
            why=why,
            now=now,
            preempted=True,
            pending=f"{why}; its ranks are stopping" if ev.stopping else why,
            by_cycle=True,
        ):
            preempted.append(jid)
    placed = _book(snapshot, plan, now)
    # Only flags that changed: every running job is re-checked every cycle.
    flips = [a.job_id for a in snapshot.active if plan.overdue.get(a.job_id, a.overdue) != a.overdue]
    for flag in (True, False):
        ids = [jid for jid in flips if plan.overdue[jid] == flag]
        if ids:
            Job.objects.filter(pk__in=ids, status=JobStatus.RUNNING).update(overdue=flag)
    current = {q.job_id: q.pending_reason for q in queue}
    # Only reasons that changed: a long queue is re-walked every cycle.
    snap.write_waiting_reasons(reasons=[(jid, r) for jid, r in plan.waiting.items() if current.get(jid) != r])
    return placed, preempted

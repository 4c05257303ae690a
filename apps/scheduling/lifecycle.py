"""The job and rank lifecycle: the only code that changes a Job's status or generation, a rank's
state, or what a job holds (its allocations and their master ports).

Every transition is one function below, with its rules in one place: which states it leaves
from, what it releases and what it tells the cluster's executor (through the port,
`executor.py`). Services, the cycle, migrations and the executors call these; none of them
writes `Job.status`, `Job.generation`, `RankRun.state` or an Allocation itself (a test over the
source holds every module to that).

States (see `choices.JobStatus`)::

    queued/preempted --place--> placing --start--> running --finish--> completed | failed
          ^                        |                  |                 cancelled
          +------ requeue ---------+------------------+
                                   running --migrate--> migrating --(old ranks gone)--> placing

Holding GPUs. A live allocation books one GPU for one rank of one generation. It is released
when its rank's exit is confirmed (the executor reported it, or the rank's node is down and its
fence deadline passed), never earlier: a GPU is not handed to another job while a process of this
one may still use it. A job that leaves its generation (finished, requeued, migrated) keeps the
allocations of its ranks still running; those ranks are "stopping" (`RankRun.stop_requested_at`)
and the executor is told to stop them. A waiting job whose previous generation still has ranks
is not placed again until they are gone (the cycle holds it back, `place` checks again), so two generations of one job
never run at once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, F, Field, OuterRef, Q
from django.db.models.signals import post_save, pre_save
from django.db.models.sql import InsertQuery
from django.utils import timezone

from apps.placement.planning import ClusterSnapshot
from apps.topology.models import Gpu, Node
from topoweb.postgres.arrays import array_literal, unnest_sql

from . import cycle, executor
from .choices import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    INFRA_EXIT_CAUSES,
    WAITING_STATUSES,
    ExitCause,
    JobStatus,
    RankState,
)
from .models import Allocation, Job, RankRun
from .node_models import LOG_TAIL_CHARS

log = logging.getLogger(__name__)

REASON_TAIL_CHARS = 1500


class JobStateError(Exception):
    """A lifecycle action that the job's current status does not allow."""

    def __init__(self, job: Job, action: str, allowed: tuple[str, ...]):
        self.job = job
        self.action = action
        super().__init__(
            f"cannot {action} job {job.pk}: it is {job.status}; {action} needs status {' or '.join(allowed)}"
        )


# -- submit ------------------------------------------------------------------------------------------


def submit(job: Job, *, savepoint: bool = True) -> Job:
    """Save a new job (queued) and request a cycle once it is committed. Under a caller's
    transaction the INSERT runs in a savepoint, so a refused one (a concurrent Idempotency-Key)
    leaves that transaction usable (`savepoint` False: the caller's block is one already);
    committed by itself it is one INSERT, no BEGIN or COMMIT."""
    if job.pk is not None or job.status != JobStatus.QUEUED:
        raise ValueError("submit takes a new, queued job")
    if transaction.get_connection().in_atomic_block:
        with transaction.atomic(savepoint=savepoint):
            job.save()
            cycle.queue_cycle(job.cluster_id)
    else:
        job.save()
        cycle.queue_cycle(job.cluster_id)
    return job


@dataclass(slots=True)
class _Insert:
    """A job's INSERT in this process: the fields it writes, and its SQL once compiled."""

    fields: tuple[Field, ...]
    sql: str | None = None


@functools.cache
def _insert() -> _Insert | None:
    """The fields a job's INSERT writes (not the id, nor generated ones), looked at once per
    process; None when one has its own placeholder (SQL that depends on its value)."""
    meta = Job._meta
    fields = tuple(f for f in meta.local_concrete_fields if f is not meta.auto_field and not f.generated)
    return None if any(hasattr(f, "get_placeholder") for f in fields) else _Insert(fields)


def submit_statement(job: Job) -> tuple[str, list] | None:
    """`submit`'s INSERT of a new queued job as one statement returning the job's id and other
    database-set fields, (sql, params), for a caller that sends it with its own statements in one
    round trip and then calls `submitted` with the row it returned. The SQL is compiled once per
    process (the ORM built it per job); the parameters are those `Model.save` would send. None
    where `submit` must save the job: not Postgres, something listens for a Job's save signals,
    or a value is an expression or a field has its own placeholder (SQL that depends on values)."""
    if job.pk is not None or job.status != JobStatus.QUEUED:
        raise ValueError("submit_statement takes a new, queued job")
    if connection.vendor != "postgresql" or pre_save.has_listeners(Job) or post_save.has_listeners(Job):
        return None
    insert = _insert()
    if insert is None:
        return None
    fields, sql = insert.fields, insert.sql
    if sql is None:
        # Compiled before the values are read: compiling runs the fields' pre_save on the job.
        query = InsertQuery(Job)
        query.insert_values(fields, [job])
        compiler = query.get_compiler(connection=connection)
        compiler.returning_fields = Job._meta.db_returning_fields
        [(sql, compiled)] = compiler.as_sql()
        if len(compiled) != len(fields):
            return None
    params = []
    for field in fields:
        value = field.pre_save(job, True)
        if hasattr(value, "resolve_expression"):
            return None
        params.append(field.get_db_prep_save(value, connection=connection))
    insert.sql = sql
    return sql, params


def submitted(job: Job, row: Sequence[Any]) -> Job:
    """The end of `submit` for a job INSERTed by `submit_statement`'s statement in the caller's
    transaction: `row` (what it returned) set on the job, a cycle requested once committed."""
    for field, value in zip(Job._meta.db_returning_fields, row, strict=True):
        setattr(job, field.attname, value)
    job._state.adding = False
    job._state.db = connection.alias
    cycle.queue_cycle(job.cluster_id)
    return job


def submit_many(rows: Sequence[Job]) -> list[Job]:
    """Save new queued jobs all at once, a cycle requested on each of their clusters."""
    if any(j.pk is not None or j.status != JobStatus.QUEUED for j in rows):
        raise ValueError("submit_many takes new, queued jobs")
    with transaction.atomic():
        jobs = Job.objects.bulk_create(rows)
        for cluster_id in {j.cluster_id for j in jobs}:
            cycle.queue_cycle(cluster_id)
    return jobs


def fail_unscheduled(reasons: Mapping[int, str], now: datetime) -> dict[int, str]:
    """Mark each waiting job of `reasons` (job id -> why the cycle could not evaluate it) failed,
    so it stops costing every later cycle; returns those that were still waiting."""
    if not reasons:
        return {}
    still = set(
        Job.objects.filter(pk__in=list(reasons), status__in=WAITING_STATUSES).values_list("id", flat=True)
    )
    for jid in still:
        log.warning("job %s failed to schedule: %s", jid, reasons[jid])
        Job.objects.filter(pk=jid, status__in=WAITING_STATUSES).update(
            status=JobStatus.FAILED, pending_reason=f"failed to schedule: {reasons[jid]}", finished_at=now
        )
    return {jid: reasons[jid] for jid in still}


# -- place -------------------------------------------------------------------------------------------

PLACED_FIELDS = (
    "status",
    "placed_at",
    "pending_reason",
    "placed_policy",
    "predicted_comm_ms",
    "predicted_step_ms",
    "predicted_mfu",
    "predicted",
    "flows",
    "borrowed",
)


@dataclass(frozen=True, slots=True)
class Booking:
    """One job to place: its gids in rank order and its prediction fields (`snapshot.prediction_fields`)."""

    job_id: int
    gids: tuple[int, ...]
    fields: Mapping[str, Any]


def place(*, snapshot: ClusterSnapshot, bookings: Sequence[Booking], now: datetime) -> list[int]:
    """Place waiting jobs: each goes to placing in its next generation with its GPUs booked (one
    locked read, one batched UPDATE, one DELETE and one multi-row INSERT for all). A job no
    longer waiting (cancelled since the snapshot) gets nothing; neither does one whose previous
    generation still holds GPUs. Returns the ids placed; the executor is
    woken on their nodes."""
    if not bookings:
        return []
    ids = [b.job_id for b in bookings]
    # Locked, and only those still waiting: a job cancelled since the snapshot stays cancelled and
    # gets no GPUs (nor does one held since); a cancel arriving now waits for this commit and then
    # releases what it got.
    # A job whose previous generation still holds GPUs is left out too (the cycle holds those
    # back already; this is the guard for any other caller).
    generations = {
        pk: generation + 1
        for pk, generation, holding in Job.objects.select_for_update()
        .filter(pk__in=ids, status__in=WAITING_STATUSES, held=False)
        .annotate(holding=Exists(Allocation.objects.filter(job_id=OuterRef("pk"), live=True)))
        .values_list("id", "generation", "holding")
        if not holding
    }
    booked = [b for b in bookings if b.job_id in generations]
    if not booked:
        return []
    _mark_placed(updates=[(b.job_id, b.fields) for b in booked], now=now)
    _book(
        snapshot=snapshot,
        bookings=[(b.job_id, b.gids) for b in booked],
        generations=generations,
        now=now,
    )
    topo = snapshot.topology
    nodes = {topo.nodes[int(topo.gpu_node[g])].name for b in booked for g in b.gids}
    executor.wake(snapshot.cluster_id, nodes)
    return [b.job_id for b in booked]


def _mark_placed(*, updates: Iterable[tuple[int, Mapping[str, Any]]], now: datetime) -> None:
    """Set each (job id, prediction fields) job placing at `now`, in its next generation: on
    Postgres one UPDATE from unnest() of every job's values (one statement, parsed and planned
    once), elsewhere one statement per job sent as a batch; never one ORM update per job."""
    fields = [Job._meta.get_field(name) for name in PLACED_FIELDS]
    ids, values = [], []
    for job_id, fields_of_job in updates:
        row = {
            "status": JobStatus.PLACING.value,
            "placed_at": now,
            "pending_reason": "",
            "borrowed": False,
            **fields_of_job,
        }
        ids.append(job_id)
        values.append([f.get_db_prep_save(row[f.name], connection) for f in fields])
    if not ids:
        return
    qn = connection.ops.quote_name
    table, pk = qn(Job._meta.db_table), qn(Job._meta.pk.column)
    gen = qn(Job._meta.get_field("generation").column)
    columns = [qn(f.column) for f in fields]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            arrays, params = _unnest([Job._meta.pk, *fields], [ids, *zip(*values, strict=True)])
            sql = "UPDATE {} AS j SET {}, {} = j.{} + 1 FROM {} AS v({}, {}) WHERE j.{} = v.{}".format(
                table,
                ", ".join(f"{c} = v.{c}" for c in columns),
                gen,
                gen,
                arrays,
                pk,
                ", ".join(columns),
                pk,
                pk,
            )
            cursor.execute(sql, params)
        else:
            sql = "UPDATE {} SET {}, {} = {} + 1 WHERE {} = %s".format(
                table, ", ".join(f"{c} = %s" for c in columns), gen, gen, pk
            )
            cursor.executemany(sql, [[*row, job_id] for job_id, row in zip(ids, values, strict=True)])


def allocation_row(
    *,
    snapshot: ClusterSnapshot,
    job_id: int,
    rank: int,
    gid: int,
    generation: int,
    now: datetime,
    live: bool = True,
) -> Allocation:
    """An unsaved allocation of rank `rank` of `job_id` on gid `gid`, keeping the GPU's place by
    value (node, index, NIC) so the job's history survives a topology replace."""
    node, index = snapshot.topology.gpu_key(gid)
    return Allocation(
        job_id=job_id,
        rank=rank,
        gpu_id=snapshot.index.gpu_pk[gid],
        node_name=node,
        gpu_index=index,
        nic_name=snapshot.index.nic_name[gid],
        live=live,
        generation=generation,
        created_at=now,
    )


def assign_master_ports(rows: Sequence[Allocation]) -> None:
    """Give each rank-0 row of `rows` its generation's MASTER_PORT: a port of
    TOPOWEB_MASTER_PORTS used by no other live (or waiting) generation whose rank 0 is on the same
    node, searched from a point that depends on the job and generation (so a new generation
    rarely meets a port its predecessor just left)."""
    firsts = [r for r in rows if r.rank == 0 and r.gpu_id is not None]
    if not firsts:
        return
    node_of = dict(Gpu.objects.filter(pk__in={r.gpu_id for r in firsts}).values_list("pk", "node_id"))
    taken: dict[int, set[int]] = {}
    busy = (
        Allocation.objects.filter(rank=0, master_port__isnull=False, gpu__node_id__in=set(node_of.values()))
        .filter(Q(live=True) | Q(released_at__isnull=True))
        .values_list("gpu__node_id", "master_port")
    )
    for node_id, port in busy:
        taken.setdefault(node_id, set()).add(port)
    low, high = settings.TOPOWEB_MASTER_PORTS
    span = high - low + 1
    for row in firsts:
        used = taken.setdefault(node_of[row.gpu_id], set())
        start = (row.job_id * 64 + row.generation) % span
        port = next(
            (low + (start + i) % span for i in range(span) if low + (start + i) % span not in used), None
        )
        if port is None:
            port = low + start
            log.warning(
                "every MASTER_PORT in %s-%s is taken on one node; job %s shares one", low, high, row.job_id
            )
        row.master_port = port
        used.add(port)


def _book(
    *,
    snapshot: ClusterSnapshot,
    bookings: Iterable[tuple[int, Iterable[int]]],
    generations: Mapping[int, int],
    now: datetime,
) -> None:
    """Book each (job id, gids) job as live allocation rows of generation `generations[job id]`,
    rank r on gids[r]: one DELETE of released rows and one multi-row INSERT for all of them."""
    ids: list[int] = []
    rows: list[Allocation] = []
    for job_id, gids in bookings:
        ids.append(job_id)
        rows += [
            allocation_row(
                snapshot=snapshot,
                job_id=job_id,
                rank=rank,
                gid=int(gid),
                generation=generations[job_id],
                now=now,
            )
            for rank, gid in enumerate(gids)
        ]
    if not ids:
        return
    # Rows released before (a preempted job's) go.
    Allocation.objects.filter(job_id__in=ids, live=False).delete()
    assign_master_ports(rows)
    if connection.vendor == "postgresql":
        _insert_allocations(rows)
    else:
        Allocation.objects.bulk_create(rows, batch_size=1000)


# Columns written by `_insert_allocations` (`released_at` stays null).
_ALLOCATION_COLUMNS = (
    "job",
    "rank",
    "gpu",
    "node_name",
    "gpu_index",
    "nic_name",
    "live",
    "generation",
    "created_at",
    "master_port",
)


def _unnest(fields: Sequence[Field], columns: Iterable[Iterable[Any]]) -> tuple[str, list[str]]:
    """`unnest_sql(fields)` and its parameters: each column of values (as the fields' columns take
    them) as one array literal."""
    return unnest_sql(fields), [array_literal(column) for column in columns]


def _insert_allocations(rows: Sequence[Allocation]) -> None:
    """One INSERT ... SELECT FROM unnest() of every row (Postgres): a few arrays, not thousands
    of parameter tuples."""
    qn = connection.ops.quote_name
    fields = [Allocation._meta.get_field(name) for name in _ALLOCATION_COLUMNS]
    columns = ", ".join(qn(field.column) for field in fields)
    arrays, params = _unnest(fields, ([getattr(row, f.attname) for row in rows] for f in fields))
    sql = f"INSERT INTO {qn(Allocation._meta.db_table)} ({columns}) SELECT * FROM {arrays}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def rebind(
    *, snapshot: ClusterSnapshot, moves: Sequence[tuple[Job, Sequence[int], Mapping[str, Any]]]
) -> None:
    """The executor runs each job of `moves` (locked, active) on other GPUs of its nodes than
    planned: its current generation's allocations become `gids` (rank order) with the prices
    `fields`, and rank 0 keeps its MASTER_PORT (the ranks already use it). All at once, so jobs
    that Slurm gave each other's planned GPUs never meet on one."""
    if not moves:
        return
    now = timezone.now()
    current = Q()
    for job, _, _ in moves:
        current |= Q(job_id=job.pk, generation=job.generation)
    ports = dict(Allocation.objects.filter(current, rank=0).values_list("job_id", "master_port"))
    Allocation.objects.filter(current).delete()
    _book(
        snapshot=snapshot,
        bookings=[(job.pk, gids) for job, gids, _ in moves],
        generations={job.pk: job.generation for job, _, _ in moves},
        now=now,
    )
    for job, _, fields in moves:
        if ports.get(job.pk) is not None:
            Allocation.objects.filter(job=job, generation=job.generation, rank=0).update(
                master_port=ports[job.pk]
            )
        Job.objects.filter(pk=job.pk).update(**fields)


# -- previous generations ----------------------------------------------------------------------------


def still_stopping(per_node: Mapping[str, int]) -> str:
    """Why a waiting job is not placed: ranks of its previous placement (count per node) still hold GPUs."""
    nodes = sorted(per_node)
    where = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    n = sum(per_node.values())
    return f"waiting for its previous placement to stop: {n} GPU{'s' if n != 1 else ''} on {where} still held by its ranks"


# -- start, finish, requeue ------------------------------------------------------------------------


def start(*, job: Job, now: datetime | None = None) -> bool:
    """Placing -> running (job locked by the caller): every rank started. True if it changed."""
    if job.status != JobStatus.PLACING:
        return False
    job.status = JobStatus.RUNNING
    job.started_at = now or timezone.now()
    job.pending_reason = ""
    job.save(update_fields=["status", "started_at", "pending_reason"])
    return True


def finish(*, job: Job, status: str, reason: str = "", now: datetime | None = None) -> Job:
    """End `job` (locked by the caller, not finished yet) as completed, failed or cancelled: GPUs
    whose ranks are not running are released, the running ranks are told to stop (their GPUs
    free up as their exits are confirmed), a cycle is queued."""
    if status not in FINISHED_STATUSES:
        raise ValueError(f"finish takes a finished status, not {status!r}")
    if job.status in FINISHED_STATUSES:
        raise JobStateError(job, str(status), ("queued", "preempted", "placing", "running", "migrating"))
    now = now or timezone.now()
    job.status = status
    job.pending_reason = reason
    job.finished_at = now
    job.overdue = False
    job.held = False  # a hold only kept a waiting job from being placed
    job.save(update_fields=["status", "pending_reason", "finished_at", "overdue", "held"])
    _leave_generations(job.pk, job.cluster_id, now)
    return job


def requeue(
    *,
    job_id: int,
    why: str,
    now: datetime,
    preempted: bool = False,
    pending: str = "",
    by_cycle: bool = False,
) -> bool:
    """Send an active job back to the queue (`preempted` counts a preemption and keeps status
    preempted, which the cycle treats as queued; any other requeue counts in `Job.requeues`). GPUs whose ranks are not running are released;
    running ranks are told to stop, and the job is not placed again until they are gone. Needs no
    lock: the change is a conditional UPDATE. A cycle is requested, unless a cycle requeues it
    (`by_cycle`: it planned with those GPUs already). True if the job was active."""
    fields: dict[str, Any] = {
        "status": JobStatus.PREEMPTED if preempted else JobStatus.QUEUED,
        "pending_reason": pending or (why if preempted else f"requeued: {why}"),
        "requeue_reason": why,
        "requeued_at": now,
        "placed_at": None,
        "started_at": None,
        "overdue": False,
        "flows": {},
    }
    if preempted:
        fields["preemptions"] = F("preemptions") + 1
    else:
        fields["requeues"] = F("requeues") + 1
    changed = Job.objects.filter(pk=job_id, status__in=ACTIVE_STATUSES).update(**fields)
    if not changed:
        return False
    cluster_id = Job.objects.filter(pk=job_id).values_list("cluster_id", flat=True).get()
    _leave_generations(job_id, cluster_id, now, cycle_after=not by_cycle)
    return True


def interrupted(*, job: Job, why: str, now: datetime) -> None:
    """`job` (locked, active) lost ranks to a fault that is not its own (its node went down, its
    ranks were fenced or lost): back to the queue when its spec says `requeue: true` and it was
    requeued fewer than `max_requeues` times, else failed (past the limit, the reason says so)."""
    from .snapshot import job_spec

    launch = job_spec(job).launch
    if not launch.requeue:
        finish(job=job, status=JobStatus.FAILED, reason=why, now=now)
    elif (past := past_max_requeues(job, launch.max_requeues, why)) is not None:
        finish(job=job, status=JobStatus.FAILED, reason=past, now=now)
    else:
        requeue(job_id=job.pk, why=why, now=now)
        job.refresh_from_db()


def past_max_requeues(job: Job, limit: int, why: str) -> str | None:
    """The failure reason of `job` when it was requeued `limit` (its spec's `max_requeues`) times
    already and must not be again for `why`; None while it may be."""
    if job.requeues < limit:
        return None
    times = f"{job.requeues} time{'s' if job.requeues != 1 else ''}"
    return f"{why}; not requeued: it was requeued {times} already, its max_requeues is {limit}"


def _leave_generations(job_id: int, cluster_id: int, now: datetime, *, cycle_after: bool = True) -> None:
    """The job no longer runs any generation: release what no running rank holds, mark the
    running ranks stopping, queue a cycle and tell the executor to stop them."""
    _release_unheld(job_id=job_id, now=now)
    RankRun.objects.filter(job_id=job_id, state=RankState.STARTED, stop_requested_at__isnull=True).update(
        stop_requested_at=now
    )
    if cycle_after:
        cycle.queue_cycle(cluster_id)
    executor.stop(cluster_id, job_id)


def _rank_running():
    return Exists(
        RankRun.objects.filter(
            job_id=OuterRef("job_id"),
            generation=OuterRef("generation"),
            rank=OuterRef("rank"),
            state=RankState.STARTED,
        )
    )


def _release_unheld(*, job_id: int, now: datetime) -> int:
    """Release the job's GPUs except those whose rank process still runs. Rows waiting for a
    migration are dropped. Returns how many GPUs were freed."""
    Allocation.objects.filter(job_id=job_id, live=False, released_at__isnull=True).update(released_at=now)
    return (
        Allocation.objects.filter(job_id=job_id, live=True)
        .exclude(_rank_running())
        .update(live=False, released_at=now)
    )


def release_exited(*, job_id: int, now: datetime | None = None) -> int:
    """Release the live allocations of the job's generations other than its current one (and of
    every generation when it no longer holds GPUs) whose rank has no running process; a cycle is
    queued when any was freed."""
    now = now or timezone.now()
    job = Job.objects.filter(pk=job_id).values_list("status", "generation", "cluster_id").first()
    if job is None:
        return 0
    rows = Allocation.objects.filter(job_id=job_id, live=True)
    if job[0] in ACTIVE_STATUSES:
        rows = rows.exclude(generation=job[1])
    freed = rows.exclude(_rank_running()).update(live=False, released_at=now)
    if freed:
        cycle.queue_cycle(job[2])
    return freed


# -- ranks -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankEvent:
    """An executor's word on one rank: rank `rank` of `job` generation `generation` `started` or
    `exited` (with its exit code and the end of its output)."""

    job: int
    generation: int
    rank: int
    event: str
    pid: int | None = None
    exit_code: int | None = None
    log_tail: str = ""
    # Why it exited (`ExitCause`): the rank's own exit unless its executor says otherwise.
    exit_cause: str = ExitCause.EXITED


def ranks_reported(*, job: Job, node: Node, events: Iterable[RankEvent], now: datetime) -> None:
    """Record what `node`'s executor said of the ranks of `job` (locked; a repeated event is
    harmless) and move the job along: running once every rank started, completed when all exited
    0, failed at the first rank that exits otherwise; GPUs of exited ranks of stopped generations
    are released."""
    events = list(events)
    _record(job, node, events, now)
    _advance(job, now)
    if any(e.generation < job.generation for e in events) and job.status in (
        JobStatus.PLACING,
        JobStatus.RUNNING,
    ):
        # Placed again (after a migration) while ranks of its previous placement were
        # stopping: their GPUs free up as they exit.
        release_exited(job_id=job.pk, now=now)


def starts_only(*, status: str, generation: int, events: Iterable[RankEvent]) -> bool:
    """Whether `events` are only starts of ranks of a job's current `generation` while it is
    placing (its `status`): those may be recorded under a shared lock of the job (`ranks_started`)."""
    return status == JobStatus.PLACING and all(
        e.event == "started" and e.generation == generation for e in events
    )


def ranks_started(
    *, job_id: int, generation: int, node: Node, events: Iterable[RankEvent], now: datetime
) -> None:
    """Record starts of ranks of the job's current `generation` (`starts_only`), with the job
    locked FOR SHARE by the caller: the agents of a job's nodes report their starts at once and
    none waits for another's, while every change of the job's state (which locks it FOR UPDATE)
    waits for them. One statement (Postgres): new runs are inserted, a start already recorded
    changes nothing but its pid and output when given (a repeated report is harmless, even
    concurrently), an exited run nothing at all. Once this commits, the caller asks
    `all_ranks_seen` and, if so, moves the job along under its exclusive lock (`ranks_advance`)."""
    merged: dict[int, tuple[int | None, str]] = {}
    for e in events:
        pid, tail = merged.get(e.rank, (None, ""))
        merged[e.rank] = (e.pid if e.pid is not None else pid, e.log_tail[-LOG_TAIL_CHARS:] or tail)
    if not merged:
        return
    ranks = sorted(merged)
    qn = connection.ops.quote_name
    table, rank = qn(RankRun._meta.db_table), qn("rank")
    sql = (
        f"INSERT INTO {table} AS r (job_id, generation, {rank}, node_id, state, pid, exit_cause,"
        " started_at, log_tail)"
        " SELECT %s, %s, u.rk, %s, %s, u.pid, '', %s, u.tail"
        " FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS u(rk, pid, tail)"
        f" ON CONFLICT (job_id, generation, {rank}) DO UPDATE SET pid = COALESCE(EXCLUDED.pid, r.pid),"
        " log_tail = CASE WHEN EXCLUDED.log_tail <> '' THEN EXCLUDED.log_tail ELSE r.log_tail END"
        " WHERE r.state <> %s"
    )
    params = [
        job_id,
        generation,
        node.pk,
        RankState.STARTED.value,
        now,
        ranks,
        [merged[r][0] for r in ranks],
        [merged[r][1] for r in ranks],
        RankState.EXITED.value,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def all_ranks_seen(*, job_id: int, generation: int, gpus: int) -> bool:
    """Whether every rank of the job's generation has a run. Asked after the caller's starts
    committed (never inside their transaction): of transactions committing starts at once, each
    sees its own and those committed before it asks, so the last to commit sees all of them."""
    return RankRun.objects.filter(job_id=job_id, generation=generation).count() >= gpus


def ranks_advance(*, job: Job, now: datetime) -> None:
    """Move `job` (locked FOR UPDATE) along what its ranks reported (`ranks_reported` without
    new events): running once every rank started."""
    _advance(job, now)


def _record(job: Job, node: Node, events: list[RankEvent], now: datetime) -> None:
    """Apply `events` in order to the runs they name: one query reads those runs, one INSERT adds
    the new ones, each existing run touched is saved once (a node reports all its ranks at once,
    under the job's lock). An event about a run that already exited changes nothing."""
    scope = {"generation__in": {e.generation for e in events}, "rank__in": {e.rank for e in events}}
    runs = {(r.generation, r.rank): r for r in RankRun.objects.filter(job=job, **scope)}
    new: dict[tuple[int, int], RankRun] = {}
    changed: dict[tuple[int, int], RankRun] = {}
    for e in events:
        key = (e.generation, e.rank)
        run = runs.get(key)
        if run is None:
            run = RankRun(job=job, generation=e.generation, rank=e.rank, node=node, started_at=now)
            if job.status not in ACTIVE_STATUSES or e.generation != job.generation:
                # Started after its generation was left: stop it at once.
                run.stop_requested_at = now
            runs[key] = new[key] = run
        elif run.state == RankState.EXITED:
            continue
        if e.pid is not None:
            run.pid = e.pid
        if e.log_tail:
            run.log_tail = e.log_tail[-LOG_TAIL_CHARS:]
        if e.event == "exited":
            run.state = RankState.EXITED
            run.exit_code = e.exit_code
            run.exit_cause = e.exit_cause
            run.exited_at = now
        if key not in new:
            changed[key] = run
    if new:
        RankRun.objects.bulk_create(new.values())
    for run in changed.values():
        run.save()


# A rank that did not complete: exited otherwise than 0, or ended by a fault not its own.
FAILED_RUN = Q(state=RankState.EXITED) & (~Q(exit_code=0) | Q(exit_cause__in=INFRA_EXIT_CAUSES))

# What happened to a rank that ended for a fault not its own, and why when its agent said nothing.
_INFRA_TEXT = {
    ExitCause.LOST: ("was lost", "its node agent lost track of it; its exit status is unknown"),
    ExitCause.FENCED: ("was fenced", "its node agent stopped it, having had no contact with the server"),
    ExitCause.STOPPED: ("was stopped by its node agent", "its generation was no longer wanted"),
    ExitCause.NODE_DOWN: ("was lost with its node", "the node is down and its fence deadline passed"),
}
_LIMIT_TEXT = {
    ExitCause.PIDS_LIMIT: "ran into its limit of processes and threads (pids_max)",
    ExitCause.MEMORY_LIMIT: "was killed by the OOM killer at its memory limit (memory_mb)",
    ExitCause.REFUSED: "was refused by its node agent",
}


def _fail_reason(run: RankRun) -> str:
    """Why the job failed at the exit of `run` (its own doing): how it ended, its last output."""
    tail = run.log_tail[-REASON_TAIL_CHARS:].strip()
    code = run.exit_code
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    if run.exit_cause in _LIMIT_TEXT:
        how = f"{_LIMIT_TEXT[run.exit_cause]} and {how.removeprefix('was ')}"
    text = f"rank {run.rank} on node {run.node.name} {how}"
    return f"{text}; last output:\n{tail}" if tail else text


def _interrupt_reason(run: RankRun) -> str:
    """Why the rank `run` ended by a fault not its own: "rank 3 on node b was fenced: the node
    agent had no contact with the server for 130 s" (its agent's note, the last line of its
    output, when it left one)."""
    what, default = _INFRA_TEXT[ExitCause(run.exit_cause)]
    lines = run.log_tail.strip().splitlines()
    note = default
    if lines:
        head, sep, rest = lines[-1].partition(": ")
        if sep and head in ("lost", "fenced", "stopped") and rest.strip():
            note = rest.strip()[:300]
    return f"rank {run.rank} on node {run.node.name} {what}: {note}"


def _advance(job: Job, now: datetime) -> None:
    """Move `job` (locked) along what its ranks reported: at the first rank that did not complete,
    failed when that was its own doing (`_fail_reason`), `interrupted` when not."""
    runs = RankRun.objects.filter(job=job, generation=job.generation)
    if job.status in (JobStatus.PLACING, JobStatus.RUNNING):
        failed = runs.filter(FAILED_RUN).select_related("node").order_by("exited_at", "rank").first()
        if failed is not None:
            if failed.exit_cause in INFRA_EXIT_CAUSES:
                interrupted(job=job, why=_interrupt_reason(failed), now=now)
            else:
                finish(job=job, status=JobStatus.FAILED, reason=_fail_reason(failed), now=now)
            return
        counts = runs.aggregate(
            seen=Count("id"),
            exited=Count("id", filter=Q(state=RankState.EXITED, exit_code=0) & ~FAILED_RUN),
        )
        if counts["exited"] == job.gpus:
            # Every rank started, even when their starts came with their exits: it ran.
            start(job=job, now=now)
            finish(job=job, status=JobStatus.COMPLETED, now=now)
            return
        if job.status == JobStatus.PLACING and counts["seen"] == job.gpus:
            start(job=job, now=now)
        return
    if job.status == JobStatus.MIGRATING:
        _migration_continue(job, now)
        return
    release_exited(job_id=job.pk, now=now)


def ranks_running(*, job: Job, generation: int, now: datetime) -> int:
    """An executor that starts the ranks itself (Slurm) runs the job's `generation`: each rank of
    its live allocations is recorded as a run on its node, once. Returns how many were new."""
    rows = Allocation.objects.filter(job=job, generation=generation, live=True).values_list(
        "rank", "gpu__node_id"
    )
    known = set(RankRun.objects.filter(job=job, generation=generation).values_list("rank", flat=True))
    new = [
        RankRun(job=job, generation=generation, rank=r, node_id=n, started_at=now)
        for r, n in rows
        if r not in known
    ]
    RankRun.objects.bulk_create(new, ignore_conflicts=True)
    return len(new)


def ranks_ended(
    *, job_id: int, generation: int, exit_code: int | None, exit_cause: str, now: datetime
) -> int:
    """Such an executor's job for `generation` ended: its runs still counted as running exit with
    `exit_code` for `exit_cause`. The job is not moved along (its executor ends it: `finish`,
    `requeue`); their GPUs are released by that, or by `release_exited`. Returns how many exited."""
    return RankRun.objects.filter(job_id=job_id, generation=generation, state=RankState.STARTED).update(
        state=RankState.EXITED, exit_code=exit_code, exit_cause=exit_cause, exited_at=now
    )


def ranks_lost(*, node: Node, why: str, now: datetime | None = None) -> list[int]:
    """The ranks still counted as running on `node` are gone (its node is down and fenced, or its
    executor has no trace of them): each is recorded exited with `why` and its GPU released; the
    jobs they belong to move on as at an exit. Returns the ids of those jobs."""
    now = now or timezone.now()
    job_ids = sorted(
        set(RankRun.objects.filter(node=node, state=RankState.STARTED).values_list("job_id", flat=True))
    )
    for job in Job.objects.select_for_update().filter(pk__in=job_ids).order_by("pk"):
        keys = list(
            RankRun.objects.filter(job=job, node=node, state=RankState.STARTED).values_list(
                "generation", "rank"
            )
        )
        if job.status in ACTIVE_STATUSES and any(g == job.generation for g, _ in keys):
            interrupted(job=job, why=f"node {node.name}: {why}", now=now)
        ranks_reported(
            job=job,
            node=node,
            events=[
                RankEvent(job.pk, g, r, "exited", log_tail=why, exit_cause=ExitCause.NODE_DOWN)
                for g, r in keys
            ],
            now=now,
        )
    return job_ids


# -- migrate -----------------------------------------------------------------------------------------


def migrate(
    *, job: Job, snapshot: ClusterSnapshot, new_gids: tuple[int, ...], fields: Mapping[str, Any]
) -> None:
    """Start generation g+1 of `job` (locked, placing or running) on `new_gids` priced `fields`:
    when ranks of generation g still run, the job is migrating, its old GPUs stay live and the new
    GPUs it already holds wait (not live) until every old rank exited; otherwise the allocations
    are swapped at once."""
    now = timezone.now()
    if job.status not in (JobStatus.PLACING, JobStatus.RUNNING):
        raise JobStateError(job, "migrate", ("placing", "running"))
    Job.objects.filter(pk=job.pk).update(**fields)
    generation = job.generation + 1
    old = set(Allocation.objects.filter(job=job, live=True).values_list("gpu_id", flat=True))
    running = RankRun.objects.filter(job=job, state=RankState.STARTED).exists()
    pks = snapshot.index.gpu_pk
    if not running:
        _release_unheld(job_id=job.pk, now=now)
        _book(snapshot=snapshot, bookings=[(job.pk, new_gids)], generations={job.pk: generation}, now=now)
        Job.objects.filter(pk=job.pk).update(generation=generation)
        job.generation = generation
        executor.wake(job.cluster_id, None)
        return
    Allocation.objects.filter(job=job, live=False).delete()
    # Not live: a GPU the old generation still holds; it goes live when the old rank exited.
    rows = [
        allocation_row(
            snapshot=snapshot,
            job_id=job.pk,
            rank=rank,
            gid=gid,
            generation=generation,
            now=now,
            live=pks[gid] not in old,
        )
        for rank, gid in enumerate(int(g) for g in new_gids)
    ]
    assign_master_ports(rows)
    Allocation.objects.bulk_create(rows)
    RankRun.objects.filter(job=job, state=RankState.STARTED, stop_requested_at__isnull=True).update(
        stop_requested_at=now
    )
    Job.objects.filter(pk=job.pk).update(
        generation=generation,
        status=JobStatus.MIGRATING,
        pending_reason=f"migrating: generation {generation - 1} is stopping",
    )
    job.generation, job.status = generation, JobStatus.MIGRATING
    executor.stop(job.cluster_id, job.pk)


def _migration_continue(job: Job, now: datetime) -> None:
    """Once no rank of an older generation runs: release the old GPUs, book the waiting ones and
    let the new generation start (placing)."""
    if RankRun.objects.filter(job=job, generation__lt=job.generation, state=RankState.STARTED).exists():
        return
    # Old rows first: the GPUs shared by both generations then go live for the new one.
    Allocation.objects.filter(job=job, live=True).exclude(generation=job.generation).update(
        live=False, released_at=now
    )
    Allocation.objects.filter(
        job=job, generation=job.generation, live=False, released_at__isnull=True
    ).update(live=True)
    job.status = JobStatus.PLACING
    job.placed_at = now
    job.started_at = None
    job.pending_reason = f"migrated: generation {job.generation} starting on its new GPUs"
    job.save(update_fields=["status", "placed_at", "started_at", "pending_reason"])
    cycle.queue_cycle(job.cluster_id)
    executor.wake(job.cluster_id, None)

"""Node agent services: heartbeats, rank start and exit reports, the job lifecycle they drive,
node health (down, drain, resume, unhealthy GPUs) and jobs that never start.

The agent's desired state is `node_work` (selectors): every rank of a current generation on the
node whose job is placing or running and which has not exited. The agent starts what it lacks
and stops what it runs that is not listed, so stopping a job, a failed job's other ranks or a
migrating job's old generation needs no separate message. A GPU is released only once its rank's
process has exited (or its node is down): it is never handed to another job while a process may
still use it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DataError, IntegrityError, connection, models, transaction
from django.db.models import Case, DateTimeField, F, Value, When
from django.utils import timezone

from apps.scheduling import lifecycle
from apps.scheduling import snapshot as snap
from apps.scheduling.choices import ExitCause, JobStatus, NodeState, RankState
from apps.scheduling.cycle import queue_cycle
from apps.scheduling.lifecycle import RankEvent as RankReport
from apps.scheduling.models import (
    Allocation,
    Job,
    NodeHealth,
    NodeToken,
    RankLogChunk,
    RankRun,
    SyncPulse,
)
from apps.scheduling.node_models import new_node_key, node_key_hash
from apps.scheduling.nodes import node_down, node_fenced
from apps.scheduling.selectors import rank_log_max_bytes
from apps.topology.models import Cluster, Gpu, Node
from topoweb.postgres import prepared

from ..models import ClusterExecutor
from .selectors import node_gpu_indexes
from .wakeups import notify_cluster

log = logging.getLogger(__name__)


def down_after_s() -> float:
    """Seconds without a heartbeat after which a node is down."""
    return float(getattr(settings, "TOPOWEB_AGENT_DOWN_AFTER_S", 180.0))


def fence_after_s() -> float:
    """Seconds without an answered sync after which an agent stops its ranks (its lease): 12
    minutes by default, so a control-plane outage of up to 10 minutes (plus the long-poll in
    flight when it began and the agents' retry backoff) stops no rank."""
    return float(getattr(settings, "TOPOWEB_AGENT_FENCE_AFTER_S", 720.0))


FENCE_SLACK_S = 30.0


def fence_slack_s() -> float:
    """How much later than its lease an agent restarted after a long silence may still fence: it
    tries the server for up to this long before it stops re-adopted ranks (sent with every answer,
    and part of the fence deadline). At most the lease itself."""
    return min(FENCE_SLACK_S, fence_after_s())


def poll_s() -> float:
    return float(getattr(settings, "TOPOWEB_AGENT_POLL_S", 60.0))


def pulse_s() -> float:
    """The sync endpoint records that it answered at most this often (`SyncPulse.answered_at`)."""
    return min(5.0, poll_s() / 4)


def away_after_s() -> float:
    """A gap this long between answered syncs (of any node) is an outage of the server: with at
    least one live node a sync arrives at least every poll."""
    return poll_s() + 3 * pulse_s()


# The `answered_at` this process last wrote or read: within `pulse_s()` of it a sync costs no query.
_PULSE_SEEN: list[datetime] = []


def forget_sync_pulse() -> None:
    """Forget the remembered `answered_at` (tests: each starts with its own database)."""
    _PULSE_SEEN.clear()


def sync_answered(*, now: datetime) -> None:
    """Record that the sync endpoint answered a node at `now`: `answered_at` moves at most every
    `pulse_s()` (no query at all while this process saw it that recent), and `back_at` moves to
    `now` after a gap longer than `away_after_s()`, the end of an outage."""
    pulse = timedelta(seconds=pulse_s())
    if _PULSE_SEEN and timedelta(0) <= now - _PULSE_SEEN[0] < pulse:
        return
    seen = SyncPulse.objects.filter(pk=1).values_list("answered_at", flat=True).first()
    _PULSE_SEEN[:] = [now if seen is None or now - seen >= pulse else seen]
    if seen is None:
        SyncPulse.objects.get_or_create(pk=1, defaults={"answered_at": now, "back_at": now})
        return
    if now - seen < pulse:
        return
    away = now - timedelta(seconds=away_after_s())
    SyncPulse.objects.filter(pk=1, answered_at__lt=now - timedelta(seconds=pulse_s())).update(
        answered_at=now,
        back_at=Case(
            When(answered_at__lt=away, then=Value(now)), default=F("back_at"), output_field=DateTimeField()
        ),
    )


def start_timeout_s() -> float:
    """Seconds a placed job may take until every rank started before it is requeued."""
    return float(getattr(settings, "TOPOWEB_START_TIMEOUT_S", 600.0))


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """An agent's heartbeat: version, the address ranks rendezvous on, its GPUs (None when it
    could not list them) and the GPUs it found unhealthy ({"gpu", "reason"})."""

    version: str
    addr: str = ""
    inventory: list[dict[str, Any]] | None = None
    unhealthy: tuple[tuple[int, str], ...] = ()
    running: int = 0
    isolation: str = ""
    # Rank processes without a record of this server's that the agent is stopping.
    orphans: tuple[dict[str, Any], ...] = ()
    # [job, generation, rank] of the rank processes counted in `running` (None: not said).
    ranks: frozenset[tuple[int, int, int]] | None = None


def _unhealthy(node: Node, beat: Heartbeat) -> list[dict[str, Any]]:
    """GPUs to exclude: those the agent flagged, plus topology GPUs missing from its inventory."""
    if not beat.unhealthy and beat.inventory is None:
        return []
    bad = {gpu: reason for gpu, reason in beat.unhealthy}
    if beat.inventory is not None:
        found = {int(g["index"]) for g in beat.inventory}
        for index in sorted(node_gpu_indexes(node=node)):
            if index not in found:
                bad.setdefault(index, "not found by nvidia-smi")
    return [{"gpu": g, "reason": r} for g, r in sorted(bad.items())]


def agent_heartbeat(
    *, node: Node, beat: Heartbeat, agent: NodeHealth | None = None, now: datetime | None = None
) -> NodeHealth:
    """Record a heartbeat in one UPDATE: the node is seen now; a node that was down is up again.
    Only the heartbeat's own columns are written, so a drain arriving meanwhile is never undone.
    A heartbeat that changes nothing writes nothing while `last_seen` is younger than half of
    `down_after_s()` (keep the agents' poll interval at most a third of it, as the defaults do).
    `agent` is the node's row as read with the node (None: never had one). A changed health
    (back from down, other unhealthy GPUs) requests a scheduling cycle.

    A down node whose rank processes the server still counts (started, or placed there) is up
    again at once and its jobs run on. One that still runs processes of ranks the server counts as
    gone (lost at its fence deadline) stays down until a heartbeat reports them gone: they may
    hold GPUs the server already counts as free.

    Every heartbeat also records that the server answered (`sync_answered`): nodes are blamed for
    silence only over time the server was answering."""
    now = now or timezone.now()
    sync_answered(now=now)
    unhealthy = _unhealthy(node, beat)
    fields: dict[str, Any] = {
        "last_seen": now,
        "version": beat.version,
        "addr": beat.addr,
        "running": beat.running,
        "unhealthy_gpus": unhealthy,
        "orphans": list(beat.orphans),
    }
    if beat.isolation:
        fields["isolation"] = beat.isolation
    if beat.inventory is not None:
        fields["inventory"] = beat.inventory
    if agent is None:
        agent, created = NodeHealth.objects.get_or_create(node=node, defaults={**fields, "state_since": now})
        if created:
            if unhealthy:
                queue_cycle(node.cluster_id)
            return agent
    was_down = agent.state == NodeState.DOWN
    gone = _counted_gone(node, beat) if was_down and beat.running else 0
    if gone or (was_down and beat.orphans):
        still = gone + len(beat.orphans)
        reason = (
            f"back after being down, but {still} rank processes counted as gone or orphaned still run;"
            " it takes work once they are gone"
        )
        NodeHealth.objects.filter(pk=agent.pk, state=NodeState.DOWN).update(**fields, reason=reason)
        for name, value in fields.items():
            setattr(agent, name, value)
        agent.reason = reason
        return agent
    changed = was_down or agent.unhealthy_gpus != unhealthy or agent.orphans != fields["orphans"]
    fresh = agent.last_seen is not None and now - agent.last_seen < timedelta(seconds=down_after_s() / 2)
    if fresh and not changed and all(getattr(agent, k) == v for k, v in fields.items() if k != "last_seen"):
        # Nothing new and seen recently: no write (thousands of agents poll, each once a minute).
        return agent
    _write_heartbeat(agent.pk, fields, now)
    for name, value in fields.items():
        setattr(agent, name, value)
    if was_down:
        agent.state, agent.reason, agent.state_since = NodeState.UP, "", now
    if changed:
        queue_cycle(node.cluster_id)
    return agent


def _write_heartbeat(pk: int, fields: dict[str, Any], now: datetime) -> None:
    """UPDATE the agent row `pk` with `fields`; a down node is up again since `now` (its reason
    cleared). One statement written once per set of fields, prepared: thousands of agents beat
    each minute."""
    names = tuple(fields)
    prepared.execute(
        _heartbeat_sql(names),
        [
            *(NodeHealth._meta.get_field(n).get_db_prep_save(fields[n], connection) for n in names),
            NodeState.DOWN.value,
            NodeState.UP.value,
            NodeState.DOWN.value,
            NodeState.DOWN.value,
            NodeHealth._meta.get_field("state_since").get_db_prep_save(now, connection),
            pk,
        ],
    )


@functools.cache
def _heartbeat_sql(names: tuple[str, ...]) -> str:
    qn = connection.ops.quote_name
    meta = NodeHealth._meta
    state, reason, since = (qn(meta.get_field(n).column) for n in ("state", "reason", "state_since"))
    columns = "".join(f"{qn(meta.get_field(n).column)} = %s, " for n in names)
    return (
        f"UPDATE {qn(meta.db_table)} SET {columns}"
        f"{state} = CASE WHEN {state} = %s THEN %s ELSE {state} END,"
        f" {reason} = CASE WHEN {state} = %s THEN '' ELSE {reason} END,"
        f" {since} = CASE WHEN {state} = %s THEN %s ELSE {since} END WHERE {qn(meta.pk.column)} = %s"
    )


@dataclass(frozen=True, slots=True)
class AgentClaim:
    """Which agent process a sync comes from: its `instance` (random per start), the instance
    its state directory synced as before (`previous`: the agent it succeeds on that directory,
    which is gone, since each agent holds the directory's lock), its host, address and start."""

    instance: str
    previous: str = ""
    host: str = ""
    addr: str = ""
    started_at: datetime | None = None


REFUSAL_LOG_S = 60.0


def agent_claim(
    *, node: Node, agent: NodeHealth | None, claim: AgentClaim, now: datetime | None = None
) -> tuple[NodeHealth | None, dict[str, Any] | None]:
    """Bind `node`'s syncs to the claiming agent instance, or refuse it: another instance holds
    the node while its lease (`down_after_s()` from its last answered sync: a live agent writes its
    heartbeat at least every half of that, and past it the node is due down anyway) runs, unless the
    claim succeeds it on its own state directory. Returns the node's agent row and, when
    refused, the holder ({"instance", "host", "addr", "started_at", "last_sync"}). The refusal is
    recorded on the row and logged (once a minute per node). A claim without an instance (an
    agent before instances) binds nothing."""
    now = now or timezone.now()
    if not claim.instance:
        return agent, None
    mine = {"agent_instance": claim.instance, "agent_host": claim.host, "agent_started_at": claim.started_at}
    for _ in range(3):
        if agent is None:
            agent, created = NodeHealth.objects.get_or_create(
                node=node, defaults={**mine, "state_since": now}
            )
            if created:
                return agent, None
        current = agent.agent_instance
        if current == claim.instance:
            return agent, None
        silent = None if agent.last_seen is None else (now - agent.last_seen).total_seconds()
        live = current and silent is not None and silent < down_after_s()
        if live and claim.previous != current:
            return agent, _refuse(node, agent, claim, silent, now)
        # Conditional: of two instances taking over at once, one wins; the other reads again.
        if NodeHealth.objects.filter(pk=agent.pk, agent_instance=current).update(**mine):
            log.info(
                "node %s: agent instance %s on %s takes over from %s",
                node.name,
                claim.instance[:8],
                claim.host or claim.addr or "?",
                f"its predecessor {current[:8]}"
                if current and claim.previous == current
                else current[:8] or "none",
            )
            for name, value in mine.items():
                setattr(agent, name, value)
            return agent, None
        agent = NodeHealth.objects.filter(pk=agent.pk).first()
    raise RuntimeError(f"node {node.name}: agent instances keep changing")


def _refuse(node: Node, agent: NodeHealth, claim: AgentClaim, silent: float, now: datetime) -> dict[str, Any]:
    holder = {
        "instance": agent.agent_instance[:8],
        "host": agent.agent_host,
        "addr": agent.addr,
        "started_at": agent.agent_started_at.isoformat() if agent.agent_started_at else None,
        "last_sync": agent.last_seen.isoformat() if agent.last_seen else None,
        "silent_s": round(silent, 1),
    }
    refused = {
        "instance": claim.instance[:8],
        "host": claim.host,
        "addr": claim.addr,
        "started_at": claim.started_at.isoformat() if claim.started_at else None,
        "at": now.isoformat(),
    }
    before = agent.agent_refused or {}
    try:
        recent = (now - datetime.fromisoformat(before["at"])).total_seconds() < REFUSAL_LOG_S
    except (KeyError, TypeError, ValueError):
        recent = False
    if before.get("instance") != refused["instance"] or not recent:
        NodeHealth.objects.filter(pk=agent.pk).update(agent_refused=refused)
        agent.agent_refused = refused
        log.warning(
            "node %s: refused a second agent on its credential (instance %s on %s, address %s, started"
            " %s): instance %s on %s (address %s, started %s) synced %.0f s ago",
            node.name,
            refused["instance"],
            claim.host or "?",
            claim.addr or "?",
            refused["started_at"],
            holder["instance"],
            holder["host"] or "?",
            holder["addr"] or "?",
            holder["started_at"],
            silent,
        )
    return holder


def server_identity(*, cluster_id: int, agent: NodeHealth | None = None) -> tuple[str, str]:
    """This server's id for the cluster (its executor's `server_id`, made on first use; each
    database names itself anew) and the cluster's name: an agent's state directory records
    them and adopts no record made for another. `agent`: the node's row as `sync_node` read it
    (it carries both once the executor row exists)."""
    if getattr(agent, "server_id", None) and getattr(agent, "cluster_name", None):
        return agent.server_id, agent.cluster_name
    row = (
        ClusterExecutor.objects.filter(cluster_id=cluster_id)
        .values_list("server_id", "cluster__name")
        .first()
    )
    if row is None:
        executor, _ = ClusterExecutor.objects.get_or_create(cluster_id=cluster_id)
        return executor.server_id, Cluster.objects.filter(pk=cluster_id).values_list(
            "name", flat=True
        ).first() or ""
    return row


def _counted_gone(node: Node, beat: Heartbeat) -> int:
    """How many of the rank processes a heartbeat reports running the server no longer counts
    (neither a started rank run nor a live allocation on the node holds their GPU); all of them
    when the heartbeat does not say which they are."""
    if beat.ranks is None:
        return beat.running
    held = set(
        RankRun.objects.filter(node=node, state=RankState.STARTED).values_list("job_id", "generation", "rank")
    )
    held |= set(
        Allocation.objects.filter(live=True, gpu__node=node).values_list("job_id", "generation", "rank")
    )
    return len(beat.ranks - held)


def agent_report(
    *, node: Node, reports: Iterable[RankReport], now: datetime | None = None
) -> list[tuple[RankReport, str]]:
    """Apply rank reports of one node (a repeated report is harmless) and move each job they
    touch: running when every rank started, completed when all exited 0, failed at the first
    rank that exits otherwise; GPUs of exited ranks of stopped jobs are released. Each job's
    reports apply in their own transaction: those whose data the database refuses are returned
    with the reason, and the others are stored all the same (a lost lock or connection raises:
    the whole sync is retried)."""
    now = now or timezone.now()
    by_job: dict[int, list[RankReport]] = {}
    for r in reports:
        by_job.setdefault(r.job, []).append(r)
    refused: list[tuple[RankReport, str]] = []
    for job_id, items in by_job.items():
        try:
            _report_job(node, job_id, items, now)
        except (DataError, IntegrityError) as exc:
            log.warning("reports of job %s from node %s refused: %s", job_id, node.name, exc)
            refused.extend((r, f"could not be stored: {type(exc).__name__}") for r in items)
    return refused


def _report_job(node: Node, job_id: int, items: list[RankReport], now: datetime) -> None:
    # Under an outer transaction the starts would not be committed before their count.
    shared = connection.vendor == "postgresql" and not connection.in_atomic_block
    if shared and _report_starts(node, job_id, items, now):
        return
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, cluster_id=node.cluster_id).first()
        if job is None:
            return
        lifecycle.ranks_reported(job=job, node=node, events=items, now=now)


def _report_starts(node: Node, job_id: int, items: list[RankReport], now: datetime) -> bool:
    """Record the starts of a placing job's ranks under a shared lock of the job (its nodes'
    reports do not queue for it one after another), then, when every rank may have been seen,
    start it under its exclusive lock. False (nothing done) unless `items` are only such starts."""
    with transaction.atomic():
        row = _job_for_share(job_id, node.cluster_id)
        if row is None:
            return False
        status, generation, gpus = row
        if not lifecycle.starts_only(status=status, generation=generation, events=items):
            return False
        lifecycle.ranks_started(job_id=job_id, generation=generation, node=node, events=items, now=now)
    # Committed: the count sees every start committed so far, this one's included.
    if lifecycle.all_ranks_seen(job_id=job_id, generation=generation, gpus=gpus):
        with transaction.atomic():
            job = Job.objects.select_for_update().filter(pk=job_id).first()
            if job is not None:
                lifecycle.ranks_advance(job=job, now=now)
    return True


def _job_for_share(job_id: int, cluster_id: int) -> tuple[str, int, int] | None:
    """The status, generation and GPU count of the cluster's job `job_id`, locked FOR SHARE: no
    change of its state until this transaction ends, and other FOR SHARE lockers go on."""
    qn = connection.ops.quote_name
    sql = (
        f"SELECT status, generation, gpus FROM {qn(Job._meta.db_table)}"
        f" WHERE {qn(Job._meta.pk.column)} = %s AND {qn(Job._meta.get_field('cluster').column)} = %s"
        " FOR SHARE"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [job_id, cluster_id])
        return cursor.fetchone()


def notify_job_nodes(cluster_id: int, job_id: int) -> None:
    """Wake the long-polls of the nodes the job has (or had) ranks on, after commit."""
    nodes = set(Allocation.objects.filter(job_id=job_id).values_list("node_name", flat=True))
    nodes |= set(RankRun.objects.filter(job_id=job_id).values_list("node__name", flat=True))
    notify_cluster(cluster_id, sorted(nodes))


FENCE_MARGIN_S = 5.0


def fence_deadline(*, last_seen: datetime | None, grace_s: float) -> datetime | None:
    """When the ranks of a node silent since `last_seen` are surely stopped: its agent stops them
    (SIGTERM, then SIGKILL after `grace_s`) once it has not reached the server for
    `fence_after_s()`, counted from its last answered sync, or, restarted after a long silence,
    up to `fence_slack_s()` later (see apps/agent/runner.py); that sync may be up to half of
    `down_after_s()` later than `last_seen` (a heartbeat that changes nothing is not written).
    None: never seen, nothing of it can be running."""
    if last_seen is None:
        return None
    return last_seen + timedelta(
        seconds=down_after_s() / 2 + fence_after_s() + fence_slack_s() + grace_s + FENCE_MARGIN_S
    )


def silent_before(*, now: datetime) -> datetime | None:
    """Nodes last seen before this have been silent for `down_after_s()` of time the server was
    answering: the current unbroken stretch of answered syncs (from `SyncPulse.back_at` to
    `answered_at`) covers down_after_s() after their last heartbeat. None while no sync was ever
    answered. During an outage `answered_at` stands still, so no node is blamed for it; after
    one, silence counts from the server's return (what a node was silent before an outage is
    forgotten: it goes down at most down_after_s() later than it would have)."""
    pulse = SyncPulse.objects.filter(pk=1).values_list("answered_at", "back_at").first()
    if pulse is None:
        return None
    answered, back = pulse
    cutoff = min(answered, now) - timedelta(seconds=down_after_s())
    # Silent since before the outage: silence counts from the server's return.
    return cutoff if back <= cutoff else None


def stop_grace_on(node: Node) -> float:
    """The longest stop grace of the ranks still counted as running on `node`, or placed there
    (their start may not have been reported yet)."""
    jobs = Job.objects.filter(
        models.Q(rank_runs__node=node, rank_runs__state=RankState.STARTED)
        | models.Q(allocations__live=True, allocations__gpu__node=node)
    ).distinct()
    return max((snap.job_spec(j).launch.stop_grace_s for j in jobs.only("pk", "spec")), default=0.0)


def nodes_check(*, cluster: Cluster, now: datetime | None = None) -> dict[str, list]:
    """Mark nodes down that were silent for `down_after_s()` of time the server was answering
    (`silent_before`): they leave placement, their jobs run on. Once a node's fence deadline
    passed (down or not: with no other node answering, a dead node is never blamed for its
    silence), its agent has surely stopped its ranks: they count as gone (their GPUs are
    released) and its jobs fail, or requeue when their spec says `requeue: true`. Mark draining
    nodes with nothing left drained, requeue placed jobs whose ranks did not all start in time,
    and stop jobs past their time limit. Returns what changed: {"down", "fenced", "drained",
    "requeued", "timed_out"}."""
    now = now or timezone.now()
    out: dict[str, list] = {"down": [], "fenced": [], "drained": [], "requeued": [], "failed_to_start": []}
    cutoff = silent_before(now=now)
    if cutoff is not None:
        stale = NodeHealth.objects.filter(
            node__cluster=cluster,
            state__in=(NodeState.UP, NodeState.DRAINING, NodeState.DRAINED),
            last_seen__lt=cutoff,
        ).select_related("node")
        for agent in stale:
            node_down(node=agent.node, reason=f"no heartbeat for {down_after_s():.0f} s", now=now)
            out["down"].append(agent.node.name)
    # The earliest any fence deadline can be (no stop grace): only nodes silent that long.
    earliest = fence_deadline(last_seen=now, grace_s=0.0) - now
    holding = (
        NodeHealth.objects.filter(node__cluster=cluster, last_seen__lt=now - earliest)
        .filter(
            models.Q(node__rank_runs__state=RankState.STARTED) | models.Q(node__gpus__allocations__live=True)
        )
        .distinct()
    )
    for agent in holding.select_related("node"):
        deadline = fence_deadline(last_seen=agent.last_seen, grace_s=stop_grace_on(agent.node))
        if deadline is not None and deadline <= now:
            if agent.state != NodeState.DOWN:
                node_down(node=agent.node, reason="no heartbeat past its fence deadline", now=now)
                out["down"].append(agent.node.name)
            why = f"node {agent.node.name} went down and its fence deadline passed"
            node_fenced(node=agent.node, why=why, now=now)
            out["fenced"].append(agent.node.name)
    draining = NodeHealth.objects.filter(node__cluster=cluster, state=NodeState.DRAINING).select_related(
        "node"
    )
    for agent in draining:
        if not Allocation.objects.filter(live=True, gpu__node=agent.node).exists():
            NodeHealth.objects.filter(pk=agent.pk, state=NodeState.DRAINING).update(
                state=NodeState.DRAINED, state_since=now
            )
            out["drained"].append(agent.node.name)
    out["timed_out"] = stop_past_time_limit(cluster=cluster, now=now)
    deadline = now - timedelta(seconds=start_timeout_s())
    late = Job.objects.filter(cluster=cluster, status=JobStatus.PLACING, placed_at__lt=deadline)
    for job in late.only("pk"):
        outcome = job_requeue_unstarted(job=job, now=now)
        if outcome:
            out[outcome].append(job.pk)
    return out


def stop_past_time_limit(*, cluster: Cluster, now: datetime) -> list[int]:
    """Fail every running job of the cluster past its `time_limit_min` (reason "time limit: ...",
    as Slurm's TIMEOUT on a Slurm cluster): its ranks are told to stop, with their stop grace.
    Returns the job ids."""
    out = []
    running = Job.objects.filter(cluster=cluster, status=JobStatus.RUNNING, time_limit_min__isnull=False)
    for pk in [j.pk for j in running.only("pk", "started_at", "time_limit_min") if j.past_time_limit(now)]:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=pk)
            if job.status == JobStatus.RUNNING and job.past_time_limit(now):
                lifecycle.finish(job=job, status=JobStatus.FAILED, reason=job.time_limit_reason(), now=now)
                out.append(pk)
    return out


def job_requeue_unstarted(*, job: Job, now: datetime | None = None) -> str | None:
    """Requeue a placed job whose ranks have not all started within the start timeout: its GPUs
    are released (those of started ranks once they exited) and the reason recorded. A job that
    already used up its spec's `max_requeues` fails instead (a launch that never succeeds must not
    cycle forever). Returns "requeued" or "failed_to_start", or None when the job was left as it was."""
    now = now or timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status != JobStatus.PLACING or job.placed_at is None:
            return None
        if job.placed_at >= now - timedelta(seconds=start_timeout_s()):
            return None
        started = RankRun.objects.filter(job=job, generation=job.generation).count()
        why = f"{started} of {job.gpus} ranks started within the start timeout of {start_timeout_s():.0f} s"
        past = lifecycle.past_max_requeues(job, snap.job_spec(job).launch.max_requeues, why)
        if past is not None:
            lifecycle.finish(job=job, status=JobStatus.FAILED, reason=past, now=now)
            return "failed_to_start"
        return "requeued" if lifecycle.requeue(job_id=job.pk, why=why, now=now) else None


def parse_reports(items: Iterable[Mapping[str, Any]]) -> list[RankReport]:
    """RankReports from validated report dicts."""
    return [
        RankReport(
            job=int(i["job"]),
            generation=int(i["generation"]),
            rank=int(i["rank"]),
            event=str(i["event"]),
            pid=i.get("pid"),
            exit_code=i.get("exit_code"),
            exit_cause=str(i.get("cause") or ExitCause.EXITED),
            log_tail=clean_text(str(i.get("log_tail") or "")),
        )
        for i in items
    ]


def node_token_create(*, node: Node) -> tuple[NodeToken, str]:
    """A new credential for `node`'s agent: the token row (only the key's hash is stored) and the
    key, which is shown once (`Authorization: Node <key>`)."""
    key = new_node_key()
    token = NodeToken.objects.create(node=node, key_hash=node_key_hash(key), prefix=key[:10])
    return token, key


def node_tokens_revoke(*, tokens: Iterable[NodeToken], now: datetime | None = None) -> int:
    """Revoke node tokens (their agents are refused from then on); returns how many were active."""
    now = now or timezone.now()
    pks = [t.pk for t in tokens]
    return NodeToken.objects.filter(pk__in=pks, revoked_at__isnull=True).update(revoked_at=now)


def clean_text(text: str) -> str:
    """`text` as the database stores it: NUL and unpaired surrogates (invalid UTF-8 that reached
    JSON as escapes) become U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


def report_scope(*, node: Node, reports: Iterable[RankReport]) -> tuple[set[tuple], set[tuple]]:
    """Which reported ranks (job, generation, rank) are not `node`'s: (foreign, unknown). A rank
    is the node's when one of its allocations or its rank run is on the node; foreign when they
    are on another node; unknown when there is neither (its job was deleted, say)."""
    keys = {(r.job, r.generation, r.rank) for r in reports}
    if not keys:
        return set(), set()
    # Only rows of the reported jobs, generations and ranks (a job may have thousands of ranks):
    # the allocations' nodes and the runs' in one statement (every report of every sync asks).
    jobs, generations, ranks = (sorted({k[i] for k in keys}) for i in range(3))
    where: dict[tuple, set[int]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_scope_sql(len(jobs), len(generations), len(ranks)), [*jobs, *generations, *ranks] * 2)
        for job, generation, rank, node_id in cursor.fetchall():
            where.setdefault((job, generation, rank), set()).add(node_id)
    foreign = {k for k in keys if where.get(k) and node.pk not in where[k]}
    unknown = {k for k in keys if not where.get(k)}
    return foreign, unknown


@functools.lru_cache(maxsize=256)
def _scope_sql(jobs: int, generations: int, ranks: int) -> str:
    """(job, generation, rank, node id) of the allocations (their GPU's node, null without one)
    and the runs of the given jobs, generations and ranks (that many of each)."""
    qn = connection.ops.quote_name
    alloc, gpu, run = (qn(m._meta.db_table) for m in (Allocation, Gpu, RankRun))
    rank = qn("rank")

    def scope(t: str) -> str:
        marks = (", ".join(["%s"] * n) for n in (jobs, generations, ranks))
        return " AND ".join(
            f"{t}.{column} IN ({m})" for column, m in zip(("job_id", "generation", rank), marks, strict=True)
        )

    return (
        f"SELECT a.job_id, a.generation, a.{rank}, g.node_id FROM {alloc} a"
        f" LEFT JOIN {gpu} g ON g.id = a.gpu_id WHERE {scope('a')}"
        f" UNION ALL SELECT r.job_id, r.generation, r.{rank}, r.node_id FROM {run} r WHERE {scope('r')}"
    )


@dataclass(frozen=True, slots=True)
class LogChunk:
    """`size` bytes of the output of rank `rank` of `job` generation `generation` from byte
    `offset` of its log file, as text."""

    job: int
    generation: int
    rank: int
    offset: int
    size: int
    data: str


def agent_logs(
    *, node: Node, chunks: Iterable[LogChunk]
) -> tuple[dict[str, int], list[tuple[LogChunk, str]]]:
    """Store log chunks of `node`'s ranks (the caller checked they are the node's). A chunk that
    starts before what is stored already is skipped (an agent that restarted ships from 0
    again). Returns how far each rank's stored log reaches ({"job:generation:rank": bytes}, so
    the agent ships on from there) and the chunks refused with why (no rank run yet, or the
    rank's log reached `rank_log_max_bytes()`)."""
    chunks = list(chunks)
    if not chunks:
        return {}, []
    runs = {
        (j, g, r): pk
        for pk, j, g, r in RankRun.objects.filter(node=node, job_id__in={c.job for c in chunks}).values_list(
            "pk", "job_id", "generation", "rank"
        )
    }
    ends: dict[int, int] = {}
    for run_id, end in (
        RankLogChunk.objects.filter(run_id__in=set(runs.values()))
        .values("run_id")
        .annotate(end=models.Max(F("offset") + F("size")))
        .values_list("run_id", "end")
    ):
        ends[run_id] = int(end)
    limit = rank_log_max_bytes()
    refused: list[tuple[LogChunk, str]] = []
    reached: dict[str, int] = {}
    rows: list[RankLogChunk] = []
    for c in sorted(chunks, key=lambda c: (c.job, c.generation, c.rank, c.offset)):
        run_id = runs.get((c.job, c.generation, c.rank))
        key = f"{c.job}:{c.generation}:{c.rank}"
        if run_id is None:
            refused.append((c, "the rank has not reported its start on this node"))
            continue
        end = ends.get(run_id, 0)
        if c.offset < end:
            reached[key] = end
            continue
        if c.offset + c.size > limit:
            refused.append((c, f"the rank's log reached the server's limit of {limit} bytes"))
            reached[key] = end
            continue
        rows.append(RankLogChunk(run_id=run_id, offset=c.offset, size=c.size, text=c.data))
        ends[run_id] = reached[key] = c.offset + c.size
    if rows:
        RankLogChunk.objects.bulk_create(rows, ignore_conflicts=True)
    return reached, refused

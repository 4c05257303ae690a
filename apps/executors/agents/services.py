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

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DataError, IntegrityError, models, transaction
from django.db.models import Case, CharField, DateTimeField, F, TextField, Value, When
from django.utils import timezone

from apps.scheduling import lifecycle
from apps.scheduling import snapshot as snap
from apps.scheduling.choices import JobStatus, NodeState, RankState
from apps.scheduling.cycle import queue_cycle
from apps.scheduling.lifecycle import RankEvent as RankReport
from apps.scheduling.models import Allocation, Job, NodeHealth, NodeToken, RankLogChunk, RankRun
from apps.scheduling.node_models import new_node_key, node_key_hash
from apps.scheduling.nodes import node_down
from apps.scheduling.selectors import rank_log_max_bytes
from apps.topology.models import Cluster, Node

from .selectors import node_gpu_indexes
from .wakeups import notify_cluster

log = logging.getLogger(__name__)


def down_after_s() -> float:
    """Seconds without a heartbeat after which a node is down."""
    return float(getattr(settings, "TOPOWEB_AGENT_DOWN_AFTER_S", 180.0))


def fence_after_s() -> float:
    """Seconds without reaching the server after which an agent stops its ranks (its lease)."""
    return float(getattr(settings, "TOPOWEB_AGENT_FENCE_AFTER_S", down_after_s() * 2 / 3))


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

    A down node comes back up only at a heartbeat that reports no rank process running: the
    processes of before it went down (stopping, once its agent fenced them) may still hold GPUs
    the server already counts as free."""
    now = now or timezone.now()
    unhealthy = _unhealthy(node, beat)
    fields: dict[str, Any] = {
        "last_seen": now,
        "version": beat.version,
        "addr": beat.addr,
        "running": beat.running,
        "unhealthy_gpus": unhealthy,
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
    if was_down and beat.running:
        reason = (
            f"back after being down, but {beat.running} rank processes of before still run; it takes"
            " work once they are gone"
        )
        NodeHealth.objects.filter(pk=agent.pk, state=NodeState.DOWN).update(**fields, reason=reason)
        for name, value in fields.items():
            setattr(agent, name, value)
        agent.reason = reason
        return agent
    changed = was_down or agent.unhealthy_gpus != unhealthy
    fresh = agent.last_seen is not None and now - agent.last_seen < timedelta(seconds=down_after_s() / 2)
    if fresh and not changed and all(getattr(agent, k) == v for k, v in fields.items() if k != "last_seen"):
        # Nothing new and seen recently: no write (thousands of agents poll, each once a minute).
        return agent
    NodeHealth.objects.filter(pk=agent.pk).update(
        **fields,
        state=Case(
            When(state=NodeState.DOWN, then=Value(NodeState.UP.value)),
            default=F("state"),
            output_field=CharField(),
        ),
        reason=Case(
            When(state=NodeState.DOWN, then=Value("")), default=F("reason"), output_field=TextField()
        ),
        state_since=Case(
            When(state=NodeState.DOWN, then=Value(now)),
            default=F("state_since"),
            output_field=DateTimeField(),
        ),
    )
    for name, value in fields.items():
        setattr(agent, name, value)
    if was_down:
        agent.state, agent.reason, agent.state_since = NodeState.UP, "", now
    if changed:
        queue_cycle(node.cluster_id)
    return agent


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
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, cluster_id=node.cluster_id).first()
        if job is None:
            return
        lifecycle.ranks_reported(job=job, node=node, events=items, now=now)


def notify_job_nodes(cluster_id: int, job_id: int) -> None:
    """Wake the long-polls of the nodes the job has (or had) ranks on, after commit."""
    nodes = set(Allocation.objects.filter(job_id=job_id).values_list("node_name", flat=True))
    nodes |= set(RankRun.objects.filter(job_id=job_id).values_list("node__name", flat=True))
    notify_cluster(cluster_id, sorted(nodes))


FENCE_MARGIN_S = 5.0


def fence_deadline(*, last_seen: datetime | None, grace_s: float) -> datetime | None:
    """When the ranks of a node silent since `last_seen` are surely stopped: its agent stops them
    (SIGTERM, then SIGKILL after `grace_s`) once it has not reached the server for
    `fence_after_s()`, counted from its last answered sync; that sync may be up to half of
    `down_after_s()` later than `last_seen` (a heartbeat that changes nothing is not written).
    None: never seen, nothing of it can be running."""
    if last_seen is None:
        return None
    return last_seen + timedelta(seconds=down_after_s() / 2 + fence_after_s() + grace_s + FENCE_MARGIN_S)


def stop_grace_on(node: Node) -> float:
    """The longest stop grace of the ranks still counted as running on `node`."""
    jobs = Job.objects.filter(rank_runs__node=node, rank_runs__state=RankState.STARTED).distinct()
    return max((snap.job_spec(j).launch.stop_grace_s for j in jobs.only("pk", "spec")), default=0.0)


def nodes_check(*, cluster: Cluster, now: datetime | None = None) -> dict[str, list]:
    """Mark nodes that missed heartbeats down (their jobs fail, or requeue when their spec says
    `requeue: true`), count the ranks of down nodes whose fence deadline passed as gone (their
    GPUs are released), mark draining nodes with nothing left drained, and requeue placed jobs
    whose ranks did not all start in time, and stop jobs past their time limit. Returns what
    changed: {"down", "fenced", "drained", "requeued", "timed_out"}."""
    now = now or timezone.now()
    out: dict[str, list] = {"down": [], "fenced": [], "drained": [], "requeued": []}
    cutoff = now - timedelta(seconds=down_after_s())
    stale = NodeHealth.objects.filter(
        node__cluster=cluster,
        state__in=(NodeState.UP, NodeState.DRAINING, NodeState.DRAINED),
        last_seen__lt=cutoff,
    ).select_related("node")
    for agent in stale:
        node_down(node=agent.node, reason=f"no heartbeat for {down_after_s():.0f} s", now=now)
        out["down"].append(agent.node.name)
    holding = NodeHealth.objects.filter(
        node__cluster=cluster, state=NodeState.DOWN, node__rank_runs__state=RankState.STARTED
    ).distinct()
    for agent in holding.select_related("node"):
        deadline = fence_deadline(last_seen=agent.last_seen, grace_s=stop_grace_on(agent.node))
        if deadline is None or deadline <= now:
            with transaction.atomic():
                lifecycle.ranks_lost(
                    node=agent.node, why=f"lost: node {agent.node.name} is down and fenced", now=now
                )
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
        if job_requeue_unstarted(job=job, now=now):
            out["requeued"].append(job.pk)
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


def job_requeue_unstarted(*, job: Job, now: datetime | None = None) -> bool:
    """Requeue a placed job whose ranks have not all started within the start timeout: its GPUs
    are released (those of started ranks once they exited) and the reason recorded."""
    now = now or timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status != JobStatus.PLACING or job.placed_at is None:
            return False
        if job.placed_at >= now - timedelta(seconds=start_timeout_s()):
            return False
        started = RankRun.objects.filter(job=job, generation=job.generation).count()
        why = f"{started} of {job.gpus} ranks started within the start timeout of {start_timeout_s():.0f} s"
        return lifecycle.requeue(job_id=job.pk, why=why, now=now)


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
    # Only rows of the reported jobs, generations and ranks (a job may have thousands of ranks).
    scope = {
        "job_id__in": {k[0] for k in keys},
        "generation__in": {k[1] for k in keys},
        "rank__in": {k[2] for k in keys},
    }
    where: dict[tuple, set[int]] = {}
    rows = Allocation.objects.filter(**scope).values_list("job_id", "generation", "rank", "gpu__node_id")
    for job, generation, rank, node_id in rows:
        where.setdefault((job, generation, rank), set()).add(node_id)
    runs = RankRun.objects.filter(**scope).values_list("job_id", "generation", "rank", "node_id")
    for job, generation, rank, node_id in runs:
        where.setdefault((job, generation, rank), set()).add(node_id)
    foreign = {k for k in keys if where.get(k) and node.pk not in where[k]}
    unknown = {k for k in keys if not where.get(k)}
    return foreign, unknown


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

"""Node health, whoever reports it (the node agents' heartbeats, a Slurm sync): drain, resume and
down, and the node states the pages and the API show. A node is up, draining, drained or down;
one no agent ever reported from is shown "no_agent"."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from apps.topology.models import Node

from . import executor, lifecycle
from .choices import ACTIVE_STATUSES, NO_AGENT, SHOWN_NODE_STATES, UNHEALTHY, NodeState
from .cycle import queue_cycle
from .models import Allocation, Job, NodeHealth


def node_down(*, node: Node, reason: str, now: datetime | None = None) -> None:
    """The node is down: its GPUs leave the free set (nothing new is placed there). Its jobs are
    not touched: a node cut off from the server keeps running its ranks until its agent's lease
    runs out, and one back before its fence deadline is up again with its jobs running on.
    `node_fenced` ends them once its fence deadline passed (`nodes_check`)."""
    now = now or timezone.now()
    with transaction.atomic():
        NodeHealth.objects.update_or_create(
            node=node, defaults={"state": NodeState.DOWN, "reason": reason, "state_since": now}
        )
        queue_cycle(node.cluster_id)


def node_fenced(*, node: Node, why: str, now: datetime | None = None) -> list[int]:
    """The node's fence deadline passed: its agent has stopped its ranks. Every active job with a
    GPU there fails (or goes back to the queue when its spec says `requeue: true`), and the
    ranks still counted as running there are gone (their GPUs are released). Returns the ids of
    the jobs it touched."""
    now = now or timezone.now()
    touched: list[int] = []
    with transaction.atomic():
        job_ids = set(Allocation.objects.filter(live=True, gpu__node=node).values_list("job_id", flat=True))
        for job in Job.objects.select_for_update().filter(pk__in=job_ids, status__in=ACTIVE_STATUSES):
            touched.append(job.pk)
            lifecycle.interrupted(job=job, why=why, now=now)
        touched += [j for j in lifecycle.ranks_lost(node=node, why=why, now=now) if j not in touched]
        queue_cycle(node.cluster_id)
        executor.wake(node.cluster_id, None)
    return touched


def node_drain(*, node: Node, reason: str) -> NodeHealth:
    """Take no new placements on the node; running jobs finish, then it is drained. On a cluster
    whose executor keeps node states (Slurm) it is drained there first; `executor.Refused` when
    that cannot be done."""
    executor.set_node(node.cluster_id, node.name, "drain", reason)
    with transaction.atomic():
        agent, _ = NodeHealth.objects.select_for_update().get_or_create(node=node)
        before = agent.state
        if agent.state != NodeState.DOWN:
            busy = Allocation.objects.filter(live=True, gpu__node=node).exists()
            agent.state = NodeState.DRAINING if busy else NodeState.DRAINED
        if agent.state != before or agent.state_since is None:
            agent.state_since = timezone.now()
        agent.reason = reason
        agent.save(update_fields=["state", "reason", "state_since"])
        return agent


def node_resume(*, node: Node) -> NodeHealth:
    """Return a drained or draining node to service and clear its unhealthy GPUs (a down node
    comes back by itself at its next heartbeat). Resumed in Slurm first on a Slurm cluster
    (`executor.Refused` when that cannot be done)."""
    executor.set_node(node.cluster_id, node.name, "resume", "")
    with transaction.atomic():
        agent, _ = NodeHealth.objects.select_for_update().get_or_create(node=node)
        if agent.state in (NodeState.DRAINING, NodeState.DRAINED) or agent.state_since is None:
            agent.state_since = timezone.now()
        if agent.state in (NodeState.DRAINING, NodeState.DRAINED):
            agent.state = NodeState.UP
        agent.reason = ""
        agent.unhealthy_gpus = []
        agent.save(update_fields=["state", "reason", "unhealthy_gpus", "state_since"])
        queue_cycle(node.cluster_id)
        return agent


def shown_state(agent: NodeHealth | None) -> str:
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


def node_rows(
    *, cluster_id: int, state: str = "", start: int = 0, stop: int | None = None
) -> list[dict[str, Any]]:
    """The cluster's nodes as `sinfo -N` lists them, in topology order, optionally only those in
    `state` (one of NODE_STATE_FILTERS) and only the `start:stop` slice of that list (a page):
    name, shown state, reason, since when, last heartbeat, GPUs, GPUs booked, unhealthy GPUs
    ([{"gpu", "reason"}]) and the leaf."""
    nodes = node_list_q(cluster_id=cluster_id, state=state).select_related("agent", "leaf")
    nodes = nodes.annotate(n_gpus=Count("gpus", distinct=True))[start:stop]
    busy = dict(
        Allocation.objects.filter(live=True, gpu__node__in=[n.pk for n in nodes])
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


def node_list_q(*, cluster_id: int, state: str = ""):
    """The cluster's nodes in topology order, only those in `state` when given."""
    nodes = Node.objects.filter(cluster_id=cluster_id)
    if state:
        nodes = nodes.filter(node_state_q(state))
    return nodes.order_by("position", "id")


def node_state_map(*, cluster_id: int) -> dict[str, dict[str, Any]]:
    """Nodes not simply up, by name: {"state", "reason", "since", "unhealthy": [GPU index]}; a
    node with no agent row at all is "no_agent" too."""
    out: dict[str, dict[str, Any]] = {}
    rows = NodeHealth.objects.filter(node__cluster_id=cluster_id).values_list(
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
        NodeHealth.objects.filter(node__cluster_id=cluster_id)
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

"""The node agents behind scheduling's executor port (`apps.scheduling.executor`): a wake or a stop
ends the long-polls of the nodes concerned (their agents then start or stop ranks to match their
work); the periodic reconcile is `nodes_check`."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.utils import timezone

from apps.scheduling import snapshot as snap
from apps.scheduling.choices import NodeState, RankState
from apps.scheduling.executor import Finding, ForeignHold
from apps.scheduling.models import NodeHealth, RankRun

from .services import down_after_s, fence_deadline, nodes_check, notify_job_nodes, stop_grace_on
from .wakeups import notify_cluster


class AgentsExecutor:
    """TopoWeb's node agents: each long-polls its node's work (`selectors.node_work`) and starts
    or stops ranks to match it."""

    name = "agents"

    def runs(self, cluster_id: int) -> bool:
        return True

    def wake(self, cluster_id: int, nodes: Iterable[str] | None) -> None:
        notify_cluster(cluster_id, nodes)

    def stop(self, cluster_id: int, job_id: int) -> None:
        notify_job_nodes(cluster_id, job_id)

    def can_migrate(self, cluster_id: int) -> bool:
        return True

    def reconcile(self, cluster: Any) -> dict[str, Any]:
        return nodes_check(cluster=cluster)

    def foreign(self, cluster: Any) -> list[ForeignHold]:
        return []

    def owner_refusal(self, cluster_id: int, user_id: int, username: str) -> str:
        """None here: each node's agent checks the account at every rank start (it exists there,
        is not root or a system account) and fails the rank naming why."""
        return ""

    def set_node(self, cluster_id: int, node: str, state: str, reason: str) -> None:
        """Nothing to do: TopoWeb keeps the node states of agent clusters itself."""

    def check(self, cluster: Any) -> list[Finding]:
        """stop-overdue: a rank told to stop longer ago than its stop grace plus the time a cut-off
        node takes to be declared down, on a node that is not down (its agent does not stop it);
        fenced-not-freed: ranks still counted running on a down node well past its fence deadline
        (the periodic reconcile is not running)."""
        now = timezone.now()
        out: list[Finding] = []

        stopping = (
            RankRun.objects.filter(
                job__cluster=cluster, state=RankState.STARTED, stop_requested_at__isnull=False
            )
            .exclude(node__agent__state=NodeState.DOWN)
            .select_related("node", "job")
            .order_by("stop_requested_at")
        )
        for run in stopping:
            overdue = timedelta(seconds=snap.job_spec(run.job).launch.stop_grace_s + down_after_s())
            if run.stop_requested_at + overdue < now:
                out.append(
                    Finding(
                        "stop-overdue",
                        f"rank {run.rank} of job {run.job_id} generation {run.generation} on {run.node.name}"
                        f" was told to stop at {run.stop_requested_at:%Y-%m-%d %H:%M:%S} and still runs",
                    )
                )
        down = NodeHealth.objects.filter(
            node__cluster=cluster, state=NodeState.DOWN, node__rank_runs__state=RankState.STARTED
        ).distinct()
        for agent in down.select_related("node"):
            deadline = fence_deadline(last_seen=agent.last_seen, grace_s=stop_grace_on(agent.node))
            if deadline is None or deadline < now - timedelta(seconds=down_after_s()):
                out.append(
                    Finding(
                        "fenced-not-freed",
                        f"{agent.node.name} is down past its fence deadline and still holds ranks counted running",
                    )
                )
        return out

"""The two executors behind scheduling's port (`apps.scheduling.executor`), registered when Django
starts: Slurm for the clusters a `ClusterExecutor` of kind slurm names, the node agents for every
other cluster."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from apps.scheduling import executor as port
from apps.scheduling.agents import nodes_check, notify_job_nodes
from apps.scheduling.wakeups import notify_cluster

log = logging.getLogger(__name__)


class AgentsExecutor:
    """TopoWeb's node agents: each long-polls its node's work (`agent_selectors.node_work`) and
    starts or stops ranks to match it; a wake ends the long-polls of the nodes concerned."""

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

    def check(self, cluster: Any) -> list[port.Finding]:
        return []


class SlurmExecutor:
    """A real Slurm through slurmrestd (`sync.py`): a wake or a stop asks for a sync of the
    cluster once the transaction commits (it submits what was placed and cancels what TopoWeb no
    longer runs)."""

    name = "slurm"

    def runs(self, cluster_id: int) -> bool:
        from .sync import is_slurm

        return is_slurm(cluster_id)

    def _sync_soon(self, cluster_id: int) -> None:
        from kombu.exceptions import OperationalError

        from .tasks import slurm_sync_task

        def later() -> None:
            try:
                slurm_sync_task.delay(cluster_id)
            except OperationalError as exc:
                log.warning("could not queue a Slurm sync of cluster %s, beat will: %s", cluster_id, exc)

        transaction.on_commit(later, robust=True)

    def wake(self, cluster_id: int, nodes: Iterable[str] | None) -> None:
        self._sync_soon(cluster_id)

    def stop(self, cluster_id: int, job_id: int) -> None:
        self._sync_soon(cluster_id)

    def can_migrate(self, cluster_id: int) -> bool:
        return False

    def reconcile(self, cluster: Any) -> dict[str, Any]:
        from .models import ClusterExecutor, ExecutorKind
        from .sync import locked_sync

        ex = ClusterExecutor.objects.filter(cluster=cluster, kind=ExecutorKind.SLURM).first()
        result = None if ex is None else locked_sync(executor=ex)
        return {} if result is None else result.as_dict()

    def check(self, cluster: Any) -> list[port.Finding]:
        return []


def register() -> None:
    port.register(AgentsExecutor(), default=True)
    port.register(SlurmExecutor())

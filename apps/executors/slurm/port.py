"""Slurm behind scheduling's executor port (`apps.scheduling.executor`): a wake asks for a sync
of the cluster (it submits what was placed), a stop cancels the job's Slurm jobs at once, the
periodic reconcile is the sync, and the check lists the Slurm jobs of this TopoWeb's that no live
job holds."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from apps.scheduling import executor as port

log = logging.getLogger(__name__)


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

        from ..tasks import slurm_sync_task

        def later() -> None:
            try:
                slurm_sync_task.delay(cluster_id)
            except OperationalError as exc:
                log.warning("could not queue a Slurm sync of cluster %s, beat will: %s", cluster_id, exc)

        transaction.on_commit(later, robust=True)

    def wake(self, cluster_id: int, nodes: Iterable[str] | None) -> None:
        self._sync_soon(cluster_id)

    def stop(self, cluster_id: int, job_id: int) -> None:
        """Cancel the job's Slurm jobs once the transaction commits (`sync.stop_job`, in a task:
        a web request does not wait for slurmrestd); the next sync's orphan pass catches what
        this misses."""
        from kombu.exceptions import OperationalError

        from ..tasks import slurm_stop_task

        def later() -> None:
            try:
                slurm_stop_task.delay(job_id)
            except OperationalError as exc:
                log.warning("could not queue the Slurm cancel of job %s, the next sync will: %s", job_id, exc)

        transaction.on_commit(later, robust=True)

    def can_migrate(self, cluster_id: int) -> bool:
        return False

    def reconcile(self, cluster: Any) -> dict[str, Any]:
        from ..models import ClusterExecutor, ExecutorKind
        from .sync import locked_sync

        ex = ClusterExecutor.objects.filter(cluster=cluster, kind=ExecutorKind.SLURM).first()
        result = None if ex is None else locked_sync(executor=ex)
        return {} if result is None else result.as_dict()

    def owner_refusal(self, cluster_id: int, user_id: int, username: str) -> str:
        from apps.scheduling.selectors import run_as

        from ..models import ClusterExecutor, ExecutorKind
        from .sync import owner_refusal

        ex = ClusterExecutor.objects.filter(cluster_id=cluster_id, kind=ExecutorKind.SLURM).first()
        if ex is None or not ex.submit_as_owner:
            return ""
        return owner_refusal(ex, run_as(user_id=user_id, username=username))

    def set_node(self, cluster_id: int, node: str, state: str, reason: str) -> None:
        """Drain or resume the node in Slurm (`sync.set_node_state`: scontrol where the executor
        allows it), else `port.Refused` saying how to in Slurm."""
        from ..models import ClusterExecutor, ExecutorKind
        from .sync import set_node_state

        ex = ClusterExecutor.objects.filter(cluster_id=cluster_id, kind=ExecutorKind.SLURM).first()
        if ex is not None:
            set_node_state(ex, node, state, reason)

    def foreign(self, cluster: Any) -> list[port.ForeignHold]:
        from ..models import ForeignAllocation

        rows = ForeignAllocation.objects.filter(cluster=cluster).values_list(
            "node__name", "gpu_index", "slurm_job_id", "cluster__executor__foreign_gbps_per_gpu"
        )
        return [port.ForeignHold(n, g, j, float(r or 0.0)) for n, g, j, r in rows]

    def check(self, cluster: Any) -> list[port.Finding]:
        """slurm-orphan: a live Slurm job tagged as this TopoWeb's that no active job holds (the
        next sync cancels it); slurm-unreachable: slurmrestd did not list the jobs. A Slurm job
        whose id a live job never saved is no finding: the next sync records it."""
        from ..models import ClusterExecutor, ExecutorKind
        from .rest import SlurmError
        from .sync import slurm_orphans

        ex = ClusterExecutor.objects.filter(cluster=cluster, kind=ExecutorKind.SLURM).first()
        if ex is None:
            return []
        try:
            found = slurm_orphans(ex)
        except SlurmError as exc:
            return [port.Finding("slurm-unreachable", f"slurmrestd did not list the jobs: {exc}")]
        return [
            port.Finding(
                "slurm-orphan",
                f"Slurm job {o['slurm_id']} ({o['state']}) of job {o['job_id']} generation"
                f" {o['generation']}: {o['why']}",
            )
            for o in found
            if o["action"] == "cancel"
        ]

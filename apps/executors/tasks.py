"""Celery tasks of the executors app: the Slurm sync of every Slurm cluster, every few seconds
(`BEAT_SCHEDULE`, merged into the settings' CELERY_BEAT_SCHEDULE), and of one cluster on demand."""

from __future__ import annotations

from celery import shared_task

SLURM_SYNC_INTERVAL_S = 3.0

BEAT_SCHEDULE = {
    "executors-slurm-sync": {"task": "executors.slurm_sync_all", "schedule": SLURM_SYNC_INTERVAL_S},
}


@shared_task(name="executors.slurm_sync", ignore_result=True)
def slurm_sync_task(cluster_id: int) -> dict | None:
    """Sync one Slurm cluster now; None when it is gone or not run by Slurm."""
    from .models import ClusterExecutor, ExecutorKind
    from .sync import locked_sync

    ex = (
        ClusterExecutor.objects.select_related("cluster")
        .filter(cluster_id=cluster_id, kind=ExecutorKind.SLURM)
        .first()
    )
    if ex is None:
        return None
    result = locked_sync(executor=ex)
    return None if result is None else result.as_dict()


@shared_task(name="executors.slurm_sync_all", ignore_result=True)
def slurm_sync_all_task() -> int:
    """Sync every Slurm cluster; returns how many were synced."""
    from .sync import slurm_sync_all

    return slurm_sync_all()

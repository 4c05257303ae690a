"""Celery tasks of the executors app: the Slurm sync of one cluster on demand (a wake or a stop
through scheduling's port) and of every Slurm cluster. Beat syncs each Slurm cluster through the
port's `reconcile` (`scheduling.reconcile_all`, every few seconds)."""

from __future__ import annotations

from celery import shared_task

BEAT_SCHEDULE: dict = {}


@shared_task(name="executors.slurm_sync", ignore_result=True)
def slurm_sync_task(cluster_id: int) -> dict | None:
    """Sync one Slurm cluster now; None when it is gone or not run by Slurm."""
    from .models import ClusterExecutor, ExecutorKind
    from .slurm.sync import locked_sync

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
    from .slurm.sync import slurm_sync_all

    return slurm_sync_all()


@shared_task(name="executors.slurm_stop", ignore_result=True)
def slurm_stop_task(job_id: int) -> list[int]:
    """Cancel a job's Slurm jobs now (TopoWeb stopped it); the Slurm job ids cancelled."""
    from apps.scheduling.models import Job

    from .slurm.sync import stop_job

    job = Job.objects.filter(pk=job_id).first()
    return [] if job is None else stop_job(job)

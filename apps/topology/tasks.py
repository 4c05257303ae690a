"""Celery tasks of the topology app: background imports (thin: the service does the work)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="topology.import_cluster", ignore_result=True, time_limit=3600, soft_time_limit=3500)
def import_cluster_task(import_id: int) -> str | None:
    """Run queued background import `import_id`; returns its status (None if gone or taken)."""
    from .services import cluster_import_run

    job = cluster_import_run(import_id=import_id)
    return None if job is None else job.status

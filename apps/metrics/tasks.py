"""Celery tasks of the metrics app: thin wrappers that take ids and call the services.

`BEAT_SCHEDULE` is merged into CELERY_BEAT_SCHEDULE by the settings.
"""

from __future__ import annotations

from celery import shared_task

# Models are imported inside the tasks: settings import BEAT_SCHEDULE before apps are ready.
COLLECT_INTERVAL_S = 15.0
ROLLUP_INTERVAL_S = 60.0
RETENTION_INTERVAL_S = 24 * 3600.0

BEAT_SCHEDULE = {
    "metrics-collect-all-clusters": {"task": "metrics.collect_all_clusters", "schedule": COLLECT_INTERVAL_S},
    "metrics-rollup-and-retain": {"task": "metrics.rollup_and_retain", "schedule": ROLLUP_INTERVAL_S},
    "metrics-retention": {"task": "metrics.retention", "schedule": RETENTION_INTERVAL_S},
}


PASS_LOCK_S = 90.0  # as long as the task's hard time limit


def pass_lock_key(cluster_id: int) -> str:
    """The cache key held while a pass over the cluster runs."""
    return f"metrics:collecting:{cluster_id}"


@shared_task(name="metrics.collect_cluster", ignore_result=True, soft_time_limit=60, time_limit=90)
def collect_cluster_task(cluster_id: int) -> int:
    """One collection pass over cluster `cluster_id`; returns the GPU readings stored (0 if gone,
    or if a pass over it is still running: beat does not stack passes that outlast the interval)."""
    from django.core.cache import cache

    from apps.topology.models import Cluster

    from .services import metrics_collect

    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None or not cache.add(pass_lock_key(cluster_id), 1, timeout=PASS_LOCK_S):
        return 0
    try:
        return metrics_collect(cluster=cluster).readings
    finally:
        cache.delete(pass_lock_key(cluster_id))


@shared_task(name="metrics.collect_all_clusters", ignore_result=True)
def collect_all_clusters_task() -> int:
    """Queue a collection pass for every cluster; returns how many clusters."""
    from apps.topology.models import Cluster

    ids = list(Cluster.objects.values_list("pk", flat=True))
    for cluster_id in ids:
        collect_cluster_task.delay(cluster_id)
    return len(ids)


@shared_task(name="metrics.rollup_and_retain", ignore_result=True)
def rollup_and_retain_task() -> int:
    """Roll finished minutes up, then delete what is past retention; returns rollup rows written."""
    from .services import metrics_retain, metrics_rollup

    written = metrics_rollup()
    metrics_retain()
    return written


@shared_task(name="metrics.retention", ignore_result=True)
def retention_task() -> dict[str, int]:
    """Delete or trim what is past its retention, metrics reports and scheduling rows alike (see
    apps/metrics/retention.py)."""
    from .retention import retention_apply

    return retention_apply()

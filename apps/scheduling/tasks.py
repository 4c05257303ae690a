"""Celery tasks of the scheduling app: thin wrappers that take ids and call the services.

A task whose cluster is gone returns quietly. `BEAT_SCHEDULE` is what `celery beat` runs
(settings reference it as CELERY_BEAT_SCHEDULE).
"""

from __future__ import annotations

from celery import shared_task

# Models are imported inside the tasks: settings import BEAT_SCHEDULE before apps are ready.
SCHEDULE_INTERVAL_S = 10.0
PROPOSE_INTERVAL_S = 60.0
NODES_CHECK_INTERVAL_S = 5.0
RETENTION_INTERVAL_S = 24 * 3600.0

BEAT_SCHEDULE = {
    "scheduling-cycle-all-clusters": {
        "task": "scheduling.schedule_all_clusters",
        "schedule": SCHEDULE_INTERVAL_S,
    },
    "scheduling-reprice-active-jobs": {
        "task": "scheduling.reprice_all_clusters",
        "schedule": SCHEDULE_INTERVAL_S,
    },
    "scheduling-check-nodes": {
        "task": "scheduling.check_all_nodes",
        "schedule": NODES_CHECK_INTERVAL_S,
    },
    "scheduling-propose-migrations": {
        "task": "scheduling.propose_all_migrations",
        "schedule": PROPOSE_INTERVAL_S,
    },
    "scheduling-retention": {
        "task": "scheduling.retention",
        "schedule": RETENTION_INTERVAL_S,
    },
}


@shared_task(name="scheduling.retention", ignore_result=True)
def retention_task() -> dict[str, int]:
    """Delete or trim what is past its retention (see apps/scheduling/retention.py)."""
    from .retention import retention_apply

    return retention_apply()


@shared_task(name="scheduling.schedule_cluster", ignore_result=True, bind=True)
def schedule_cluster_task(self, cluster_id: int) -> int | None:
    """Run one scheduling cycle on cluster `cluster_id`; returns the cycle id (None if the
    cluster is gone or a redelivered request is not retried). A request the broker delivers again
    (its worker died or stopped before finishing it) first leaves a failed cycle record saying so."""
    from apps.topology.models import Cluster

    from .cycle import cycle_record_redelivered, schedule_requested

    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return None
    try:
        redelivered = (self.request.delivery_info or {}).get("redelivered")
        if redelivered and not cycle_record_redelivered(cluster=cluster):
            return None
        cycle = schedule_requested(cluster=cluster)
    except Cluster.DoesNotExist:
        return None
    if cycle.placed:
        # A cluster run by Slurm submits what was just placed now rather than at the next sync.
        from apps.executors.sync import is_slurm
        from apps.executors.tasks import slurm_sync_task

        if is_slurm(cluster_id):
            slurm_sync_task.delay(cluster_id)
    return cycle.pk


@shared_task(name="scheduling.schedule_all_clusters", ignore_result=True)
def schedule_all_clusters_task() -> int:
    """Queue a cycle for every cluster, pending request or not: a request lost with its worker
    holds a cluster back until this tick at most. Returns how many were queued."""
    from apps.topology.models import Cluster

    from .cycle import request_cycle

    ids = list(Cluster.objects.values_list("pk", flat=True))
    return sum(request_cycle(cluster_id, coalesce=False) for cluster_id in ids)


@shared_task(name="scheduling.propose_migrations", ignore_result=True)
def propose_migrations_task(cluster_id: int) -> int:
    """Record migration proposals for the running jobs of one cluster; returns how many."""
    from apps.topology.models import Cluster

    from .proposals import migrations_propose

    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return 0
    try:
        return len(migrations_propose(cluster=cluster))
    except Cluster.DoesNotExist:
        return 0


@shared_task(name="scheduling.propose_all_migrations", ignore_result=True)
def propose_all_migrations_task() -> int:
    """Queue migration proposals for every cluster; returns how many clusters."""
    from apps.topology.models import Cluster

    ids = list(Cluster.objects.values_list("pk", flat=True))
    for cluster_id in ids:
        propose_migrations_task.delay(cluster_id)
    return len(ids)


@shared_task(name="scheduling.reprice_all_clusters", ignore_result=True)
def reprice_all_clusters_task() -> int:
    """Re-price the active jobs of every cluster (topology edits, link loads); returns how many
    jobs' predictions changed."""
    from apps.topology.models import Cluster

    from .pricing import active_jobs_reprice

    changed = 0
    for cluster in Cluster.objects.order_by("pk"):
        try:
            changed += len(active_jobs_reprice(cluster=cluster))
        except Cluster.DoesNotExist:
            continue
    return changed


@shared_task(name="scheduling.check_all_nodes", ignore_result=True)
def check_all_nodes_task() -> int:
    """Mark silent nodes down, drained nodes drained and requeue jobs that never started, on
    every cluster; returns how many nodes went down."""
    from apps.topology.models import Cluster

    from .agents import nodes_check

    down = 0
    for cluster in Cluster.objects.order_by("pk"):
        try:
            down += len(nodes_check(cluster=cluster)["down"])
        except Cluster.DoesNotExist:
            continue
    return down

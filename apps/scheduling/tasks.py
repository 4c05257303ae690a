"""Celery tasks of the scheduling app: thin wrappers that take ids and call the services.

A task whose cluster is gone returns quietly. `BEAT_SCHEDULE` is what `celery beat` runs
(settings reference it as CELERY_BEAT_SCHEDULE).
"""

from __future__ import annotations

from celery import shared_task

# Models are imported inside the tasks: settings import BEAT_SCHEDULE before apps are ready.
SCHEDULE_INTERVAL_S = 10.0
PROPOSE_INTERVAL_S = 60.0
RECONCILE_INTERVAL_S = 3.0
RECONCILE_CHECK_INTERVAL_S = 60.0

BEAT_SCHEDULE = {
    "scheduling-cycle-all-clusters": {
        "task": "scheduling.schedule_all_clusters",
        "schedule": SCHEDULE_INTERVAL_S,
    },
    "scheduling-reprice-active-jobs": {
        "task": "scheduling.reprice_all_clusters",
        "schedule": SCHEDULE_INTERVAL_S,
    },
    "scheduling-reconcile": {
        "task": "scheduling.reconcile_all",
        "schedule": RECONCILE_INTERVAL_S,
    },
    "scheduling-reconcile-check": {
        "task": "scheduling.reconcile_check",
        "schedule": RECONCILE_CHECK_INTERVAL_S,
    },
    "scheduling-propose-migrations": {
        "task": "scheduling.propose_all_migrations",
        "schedule": PROPOSE_INTERVAL_S,
    },
}


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


@shared_task(name="scheduling.reconcile_all", ignore_result=True)
def reconcile_all_task() -> int:
    """Let each cluster's executor converge on what the lifecycle wants (agents: silent nodes
    down, fenced nodes' ranks gone, drained nodes, jobs that never started; Slurm: a sync);
    returns how many clusters were reconciled."""
    from apps.topology.models import Cluster

    from .executor import reconcile

    done = 0
    for cluster in Cluster.objects.order_by("pk"):
        try:
            reconcile(cluster=cluster)
            done += 1
        except Cluster.DoesNotExist:
            continue
    return done


@shared_task(name="scheduling.reconcile_check", ignore_result=True)
def reconcile_check_task() -> int:
    """Log, as warnings, what does not converge on any cluster (`manage.py reconcile --check`);
    returns how many findings."""
    import logging

    from apps.topology.models import Cluster

    from .reconcile import findings

    log = logging.getLogger(__name__)
    found = 0
    for cluster in Cluster.objects.order_by("pk"):
        for f in findings(cluster=cluster):
            log.warning("reconcile check: cluster %s: %s: %s", cluster.name, f.kind, f.text)
            found += 1
    return found

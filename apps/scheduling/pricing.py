"""Keeping running jobs' predictions current: a topology edit (a link's bandwidth changed in the
admin) or other jobs' link loads changing re-prices every active placement."""

from __future__ import annotations

import math

from django.db import transaction

from apps.topology.models import Cluster

from . import snapshot as snap
from .models import Job

PRICED = ("predicted_comm_ms", "predicted_step_ms", "predicted_mfu")


def _changed(job: Job, fields: dict) -> bool:
    for name in PRICED:
        old, new = getattr(job, name), fields[name]
        if (old is None) != (new is None) or (new is not None and not math.isclose(old, new, rel_tol=1e-9)):
            return True
    return job.flows != fields["flows"]


def active_jobs_reprice(*, cluster: Cluster) -> list[int]:
    """Price every active job's current placement against the cluster's topology and the other
    jobs' link loads now; store the new predictions of those that changed. Returns their ids."""
    with transaction.atomic():
        locked = Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
        snapshot = snap.cluster_snapshot(cluster=locked)
        active = [a for a in snapshot.active if a.gids]
        if not active:
            return []
        jobs = Job.objects.in_bulk([a.job_id for a in active])
        changed = []
        for a in active:
            job = jobs.get(a.job_id)
            if job is None:
                continue
            fields = snap.priced_fields(
                snapshot=snapshot,
                spec=snap.job_spec(job),
                gids=a.gids,
                policy=job.placed_policy or locked.policy,
                own_flows=a.flows,
            )
            if _changed(job, fields):
                Job.objects.filter(pk=job.pk).update(**fields)
                changed.append(job.pk)
        return changed

"""Rows that let a worker keep a cluster's occupancy (running jobs' GPUs, flows, launched ranks)
between scheduling cycles instead of reading it whole every cycle.

Imported by `models.py` (Django finds models there). On Postgres, triggers (migration
0016_occupancy) add an `OccupancyChange` row for every committed change to what a snapshot reads
of a job: an active job's row, a live allocation, a started rank. SQLite has no such triggers and
every cycle reads the occupancy whole.
"""

from __future__ import annotations

from django.db import models


class OccupancyChange(models.Model):
    """A job whose occupancy changed (written by database triggers, in the changing transaction).

    Plain integer columns, not foreign keys: the triggers also fire while a cluster or job is being
    deleted, and a deferred foreign key would then fail that deletion's commit. `xact` is the
    writing transaction's id (`txid_current()`), so a cycle can tell its own changes apart.
    """

    id = models.BigAutoField(primary_key=True)
    cluster_id = models.BigIntegerField(null=True, db_index=True)
    job_id = models.BigIntegerField()
    xact = models.BigIntegerField(null=True)

    def __str__(self) -> str:
        return f"occupancy of job {self.job_id} changed"


class ClusterOccupancy(models.Model):
    """A cluster's occupancy epoch: every scheduling cycle bumps it under the cluster lock, so a
    worker's kept occupancy is valid only if the last cycle on the cluster was its own."""

    cluster = models.OneToOneField("topology.Cluster", on_delete=models.CASCADE, related_name="+")
    epoch = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"occupancy epoch {self.epoch} of cluster {self.cluster_id}"

"""A worker's kept occupancy of each cluster between scheduling cycles.

Reading a cluster's occupancy whole (every live allocation, every active job's row, which jobs
have started ranks) was most of a cycle on a large cluster. On Postgres a worker keeps what it
read, as `JobHold`s by job id, and the next cycle re-reads only the jobs that changed since:

- Triggers (migration 0016_occupancy) add an `OccupancyChange` row, in the changing transaction,
  for every job whose active row, live allocations or started ranks a statement changed, whoever
  wrote it (a cycle, a cancel, an agent report, a Slurm sync, an operator's edit).
- Under the cluster lock a cycle reads the change rows, re-reads those jobs, and at its end
  re-reads the jobs its own statements changed (the change rows of its transaction), deletes the
  change rows it has seen and bumps the cluster's `ClusterOccupancy.epoch`. The occupancy is kept
  once the cycle commits, under the new epoch.
- A kept occupancy is used only if the epoch is still its own (no other worker's cycle ran on
  the cluster since) and the topology and GPU index are the same objects (a topology edit
  replaces them). Anything else, a restart, or a failed cycle: read whole.

A change committed by another transaction after a cycle read the change rows keeps its row and
is re-read by the next cycle; so a kept occupancy never misses a GPU taken or freed outside the
cycle. SQLite has no such triggers: there every cycle reads the occupancy whole.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from django.db import connection, transaction

from apps.placement.planning import ClusterSnapshot, GpuIndex
from apps.placement.topology import Topology
from apps.topology.models import Cluster
from apps.topology.services import cluster_topology

from . import snapshot as snap
from .models import ClusterOccupancy, OccupancyChange

log = logging.getLogger(__name__)

# Changed jobs beyond this share of the kept ones (and beyond FULL_READ_MIN) are read whole:
# one cluster-wide read costs less than a long list of ids.
FULL_READ_SHARE = 0.5
FULL_READ_MIN = 256


@dataclass(frozen=True)
class Occupancy:
    """A cluster's job holds as of the end of the cycle that bumped the epoch to `epoch`."""

    epoch: int
    topology: Topology
    index: GpuIndex
    holds: Mapping[int, snap.JobHold]


_KEPT: dict[int, Occupancy] = {}
_KEPT_LOCK = threading.Lock()


def keeps_occupancy() -> bool:
    """True where the change triggers exist (Postgres)."""
    return connection.vendor == "postgresql"


def forget(cluster_id: int) -> None:
    """Drop the kept occupancy of a cluster (the next cycle reads it whole)."""
    with _KEPT_LOCK:
        _KEPT.pop(cluster_id, None)


def _keep(cluster_id: int, occupancy: Occupancy) -> None:
    with _KEPT_LOCK:
        current = _KEPT.get(cluster_id)
        if current is None or current.epoch < occupancy.epoch:
            _KEPT[cluster_id] = occupancy


class CycleOccupancy:
    """One cycle's occupancy: `snapshot` to plan against; `finish()` after the cycle's last write.

    Create it inside the cycle's transaction, with the cluster row locked."""

    def __init__(self, *, cluster: Cluster):
        self.cluster = cluster
        self.topology = cluster_topology(cluster=cluster, fresh=True)
        self.index = snap.gpu_index(cluster=cluster, topology=self.topology)
        self.keeps = keeps_occupancy()
        self.read_whole = True
        self.jobs_read = 0
        if not self.keeps:
            self.holds = snap.read_holds(cluster=cluster, index=self.index)
            self.jobs_read = len(self.holds)
            self.snapshot = self._assemble()
            return
        state, _ = ClusterOccupancy.objects.get_or_create(cluster=cluster)
        self.epoch = state.epoch
        self.seen = list(OccupancyChange.objects.filter(cluster_id=cluster.pk).values_list("id", "job_id"))
        with _KEPT_LOCK:
            # Taken, not shared: it is kept again only if this cycle commits.
            kept = _KEPT.pop(cluster.pk, None)
        changed = {job_id for _, job_id in self.seen}
        if (
            kept is not None
            and kept.epoch == self.epoch
            and kept.topology is self.topology
            and kept.index is self.index
            and len(changed) <= max(FULL_READ_MIN, FULL_READ_SHARE * len(kept.holds))
        ):
            self.read_whole = False
            self.holds = dict(kept.holds)
            self._reread(changed)
        else:
            self.holds = snap.read_holds(cluster=cluster, index=self.index)
            self.jobs_read = len(self.holds)
        self.snapshot = self._assemble()

    def _assemble(self) -> ClusterSnapshot:
        return snap.assemble_snapshot(
            cluster=self.cluster, topology=self.topology, index=self.index, holds=self.holds
        )

    def _reread(self, job_ids: set[int]) -> None:
        if not job_ids:
            return
        fresh = snap.read_holds(cluster=self.cluster, index=self.index, job_ids=job_ids)
        for job_id in job_ids:
            self.holds.pop(job_id, None)
        self.holds.update(fresh)
        self.jobs_read += len(job_ids)

    def finish(self) -> None:
        """Re-read the jobs this transaction changed, delete the change rows seen, bump the epoch,
        and keep the occupancy once the transaction commits."""
        if not self.keeps:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, job_id FROM scheduling_occupancychange WHERE cluster_id = %s"
                " AND xact = txid_current()",
                [self.cluster.pk],
            )
            ours = cursor.fetchall()
        self._reread({job_id for _, job_id in ours})
        done = {pk for pk, _ in self.seen} | {pk for pk, _ in ours}
        if done:
            OccupancyChange.objects.filter(pk__in=sorted(done)).delete()
        epoch = self.epoch + 1
        ClusterOccupancy.objects.filter(cluster=self.cluster).update(epoch=epoch)
        kept = Occupancy(epoch, self.topology, self.index, self.holds)
        cluster_id = self.cluster.pk
        transaction.on_commit(lambda: _keep(cluster_id, kept))

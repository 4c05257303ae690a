"""Topology writes and the core's view of a cluster: import, export, snapshot, validation.

Every spec goes through `apps.placement.topology.load_topology`, so the database, the files and the
placement core speak one format.
"""

from __future__ import annotations

import re
import threading
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError, RestrictedError
from django.utils import timezone

from apps.placement.topology import SpecError, Topology, load_topology, topology_to_spec

from .models import Cluster, ClusterImport, Gpu, Node, touch_cluster
from .rows import check_storable, create_rows, delete_rows, rows_to_spec


class ClusterExistsError(SpecError):
    """Import of a cluster whose name is taken, without `replace=True`."""


def cluster_import(*, data: Any, replace: bool = False) -> Cluster:
    """Validate a parsed spec v1 (full or `generate:` form) and write it as one cluster, atomically.

    With `replace=True` a cluster of the same name keeps its row (id, policy, settings) and has all
    its topology rows replaced; its finished jobs keep their placements by value, waiting jobs are
    planned on the new topology. Raises SpecError (ClusterExistsError on a name clash,
    ClusterBusyError naming the jobs that hold its GPUs); on any error nothing is written.
    """
    topo = load_topology(data)
    check_storable(topo)
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().filter(name=topo.name).first()
        if cluster is not None and not replace:
            raise ClusterExistsError(
                [
                    (
                        "name",
                        f"a cluster named {topo.name!r} already exists (import with replace to overwrite it)",
                    )
                ]
            )
        if cluster is None:
            try:
                with transaction.atomic():
                    cluster = Cluster.objects.create(name=topo.name)
            except IntegrityError as exc:
                # Another import of the same name committed between our read and our insert.
                raise ClusterExistsError([("name", f"a cluster named {topo.name!r} already exists")]) from exc
        else:
            _check_replaceable(cluster)
            try:
                delete_rows(cluster=cluster)
            except (ProtectedError, RestrictedError) as exc:
                raise SpecError(
                    [
                        (
                            "name",
                            f"cluster {topo.name!r} cannot be replaced while rows refer to its GPUs: {exc.args[0]}",
                        )
                    ]
                ) from exc
        create_rows(cluster=cluster, topo=topo)
        cluster.save(update_fields=["updated_at"])
    _forget(cluster.pk)
    return cluster


LIVE_JOBS_NAMED = 10  # live jobs named in a refused replace; the rest are counted


class ClusterBusyError(SpecError):
    """Replace of a cluster some of whose jobs hold GPUs."""


def _check_replaceable(cluster: Cluster) -> None:
    """Raise ClusterBusyError naming the jobs that hold GPUs of `cluster` (called under its row
    lock, which the scheduling cycle takes too, so no job is placed meanwhile)."""
    live = list(
        Gpu.objects.filter(node__cluster=cluster, allocations__live=True)
        .order_by("allocations__job_id")
        .values_list("allocations__job_id", "allocations__job__name", "allocations__job__status")
        .distinct()
    )
    if not live:
        return
    named = ", ".join(f"job {pk} {name!r} ({status})" for pk, name, status in live[:LIVE_JOBS_NAMED])
    more = f" and {len(live) - LIVE_JOBS_NAMED} more" if len(live) > LIVE_JOBS_NAMED else ""
    raise ClusterBusyError(
        [
            (
                "name",
                f"cluster {cluster.name!r} cannot be replaced while jobs hold its GPUs: {named}{more};"
                " replace it once they have finished, or cancel them",
            )
        ]
    )


def cluster_to_spec(*, cluster: Cluster) -> dict:
    """The cluster as a full spec v1 dict, entries in stored order; SpecError if the rows are invalid."""
    return topology_to_spec(_load(cluster))


def cluster_validate(*, cluster: Cluster) -> list[tuple[str, str]]:
    """Every problem with the cluster's rows against spec v1, as (field path, message); [] if valid."""
    spec, problems = rows_to_spec(cluster=cluster)
    try:
        load_topology(spec)
    except SpecError as exc:
        problems = problems + [p for p in exc.errors if p not in problems]
    return [(field, _name_node(spec, field, msg)) for field, msg in problems]


_CACHE: dict[int, tuple[datetime, Topology]] = {}
_CACHE_LOCK = threading.Lock()


def cluster_topology(*, cluster: Cluster, fresh: bool = False) -> Topology:
    """The placement core's immutable snapshot of the cluster, cached per cluster id and updated_at.

    Reads the current `updated_at` from the database, so a stale `cluster` instance never returns a
    stale topology; `fresh=True` says the instance was read from the database just now and uses its
    own `updated_at` instead (one query fewer). Raises Cluster.DoesNotExist if the row is gone and
    SpecError if it is invalid.
    """
    if fresh:
        stamp = cluster.updated_at
    else:
        stamp = Cluster.objects.filter(pk=cluster.pk).values_list("updated_at", flat=True).first()
    if stamp is None:
        raise Cluster.DoesNotExist(f"cluster {cluster.pk} no longer exists")
    with _CACHE_LOCK:
        hit = _CACHE.get(cluster.pk)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    topo = _load(cluster)
    with _CACHE_LOCK:
        _CACHE[cluster.pk] = (stamp, topo)
    return topo


def node_refresh_leaf(*, node: Node) -> None:
    """Set `node.leaf` to its first NIC's leaf (None without NICs), as spec v1 derives it."""
    first = node.nics.order_by("id").values_list("leaf_id", flat=True).first()
    if node.leaf_id != first:
        node.leaf_id = first
        node.save(update_fields=["leaf"])


def cluster_touch(*, cluster: Cluster) -> None:
    """Mark the cluster changed (for writes that bypass model save, such as bulk deletes)."""
    touch_cluster(cluster.pk)


def _load(cluster: Cluster) -> Topology:
    spec, problems = rows_to_spec(cluster=cluster)
    if problems:
        raise SpecError(problems)
    return load_topology(spec)


def _forget(cluster_id: int) -> None:
    with _CACHE_LOCK:
        _CACHE.pop(cluster_id, None)


_NODE_PATH = re.compile(r"^nodes\[(\d+)\]")


def _name_node(spec: dict, field: str, msg: str) -> str:
    """Prefix a message about `nodes[i]...` with the node's name, unless it names it already."""
    match = _NODE_PATH.match(field)
    if not match:
        return msg
    nodes = spec.get("nodes", [])
    i = int(match.group(1))
    name = nodes[i].get("name") if i < len(nodes) else None
    if not name or repr(name) in msg:
        return msg
    return f"node {name!r}: {msg}"


IMPORT_STAGES = ("queued", "importing", "done")


def cluster_import_queue(*, data: Any, replace: bool, user=None, notes: list | None = None) -> ClusterImport:
    """Queue a background import of a parsed spec; the task runs once this transaction commits."""
    from .tasks import import_cluster_task

    with transaction.atomic():
        job = ClusterImport.objects.create(spec=data, replace=replace, created_by=user, notes=notes or [])
        transaction.on_commit(lambda: import_cluster_task.delay(job.pk), robust=True)
    return job


def _stage(job: ClusterImport, stage: str, **fields) -> None:
    progress = IMPORT_STAGES.index(stage) / (len(IMPORT_STAGES) - 1)
    ClusterImport.objects.filter(pk=job.pk).update(stage=stage, progress=progress, **fields)


def cluster_import_run(*, import_id: int) -> ClusterImport | None:
    """Run a queued background import (what its worker does): the cluster is written whole or
    not at all; the errors by field are kept when it fails. None when the row is gone or taken."""
    taken = ClusterImport.objects.filter(pk=import_id, status=ClusterImport.Status.QUEUED).update(
        status=ClusterImport.Status.RUNNING
    )
    if not taken:
        return None
    job = ClusterImport.objects.get(pk=import_id)
    # Validating and writing are one step: cluster_import checks the spec and writes it in one transaction.
    _stage(job, "importing")
    try:
        cluster = cluster_import(data=job.spec, replace=job.replace)
    except SpecError as exc:
        ClusterImport.objects.filter(pk=job.pk).update(
            status=ClusterImport.Status.FAILED, errors=exc.as_dict(), spec=None, finished_at=timezone.now()
        )
    else:
        _stage(
            job,
            "done",
            status=ClusterImport.Status.DONE,
            cluster=cluster,
            spec=None,
            finished_at=timezone.now(),
        )
    return ClusterImport.objects.get(pk=job.pk)

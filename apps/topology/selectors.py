"""Read-only queries on topology rows for the admin, the dashboard and the API."""

from __future__ import annotations

import time

from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from .choices import SwitchTier
from .models import Cluster, Gpu, Node, Switch


def _count_of(queryset: QuerySet, field: str) -> Coalesce:
    counted = queryset.filter(**{field: OuterRef("pk")}).order_by().values(field).annotate(n=Count("pk"))
    return Coalesce(Subquery(counted.values("n"), output_field=IntegerField()), 0)


# Every submission names its cluster: under a burst, hundreds of lookups a second of a row that
# changes a few times a day. A row this process read within RECENT_CLUSTER_S seconds answers them
# (a fifth of a submission's CPU and one round trip); changes made in this process forget them at
# once, other processes' changes are seen at most this late (see `job_submit`).
RECENT_CLUSTER_S = 1.0
_recent: dict[str, tuple[float, Cluster]] = {}


def cluster_named(name: str, *, recent: bool = False) -> Cluster | None:
    """The cluster called `name`, else None; `recent=True` may answer with a row this process read
    within the last RECENT_CLUSTER_S seconds."""
    if recent:
        hit = _recent.get(name)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
    found = Cluster.objects.filter(name=name).first()
    if found is not None:
        if len(_recent) > 1000:  # names that came and went
            _recent.clear()
        _recent[name] = (time.monotonic() + RECENT_CLUSTER_S, found)
    return found


def forget_recent_clusters(**_signal) -> None:
    """Drop every row `cluster_named` keeps (a cluster was saved, touched or deleted here)."""
    _recent.clear()


def cluster_list() -> QuerySet[Cluster]:
    """Clusters by name, each annotated with `node_count`, `gpu_count` and `switch_count` (one query)."""
    return Cluster.objects.annotate(
        node_count=_count_of(Node.objects.all(), "cluster"),
        gpu_count=_count_of(Gpu.objects.all(), "node__cluster"),
        switch_count=_count_of(Switch.objects.all(), "cluster"),
    ).order_by("name")


def cluster_summary(*, cluster: Cluster) -> dict:
    """Counts of one cluster: nodes, GPUs, NVLink domains, links, switches per tier, and leaf names
    in stored order."""
    tiers = dict(
        Switch.objects.filter(cluster=cluster).order_by().values_list("tier").annotate(n=Count("pk"))
    )
    leaves = list(
        Switch.objects.filter(cluster=cluster, tier=SwitchTier.LEAF)
        .order_by("position", "id")
        .values_list("name", flat=True)
    )
    return {
        "name": cluster.name,
        "nodes": Node.objects.filter(cluster=cluster).count(),
        "gpus": Gpu.objects.filter(node__cluster=cluster).count(),
        "nvlink_domains": cluster.nvlink_domains.count(),
        "links": cluster.links.count(),
        "switches": {tier: tiers.get(tier, 0) for tier in SwitchTier.values},
        "leaves": leaves,
    }

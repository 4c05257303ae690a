"""Read-only queries of the metrics app, for the API, the dashboard and templates."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Avg, Count, Max, Min, QuerySet
from django.utils import timezone

from apps.scheduling.models import Job
from apps.topology.models import Cluster

from .hotspots import HOTSPOT_INTERVALS
from .models import GpuLatest, GpuRollup, GpuSample, Hotspot, JobReport, JobSample, NodeScrape
from .services import source_settings
from .store import STALE_INTERVALS


def gpu_latest(*, cluster: Cluster | None = None) -> QuerySet[GpuLatest]:
    """Latest values per GPU and MIG instance, by node and index."""
    qs = GpuLatest.objects.select_related("gpu__node__cluster")
    if cluster is not None:
        qs = qs.filter(gpu__node__cluster=cluster)
    return qs.order_by(
        "gpu__node__cluster_id", "gpu__node__position", "gpu__node_id", "gpu__index", "instance"
    )


def gpu_history(*, since: datetime, minute: bool = False) -> QuerySet:
    """Raw samples since `since` (kept an hour), or 1-minute rollups (kept a day), oldest first."""
    if minute:
        return (
            GpuRollup.objects.select_related("gpu__node__cluster")
            .filter(minute__gte=since)
            .order_by("minute", "gpu_id", "instance")
        )
    return (
        GpuSample.objects.select_related("gpu__node__cluster")
        .filter(at__gte=since)
        .order_by("at", "gpu_id", "instance")
    )


def node_scrapes() -> QuerySet[NodeScrape]:
    """Every node's collection state."""
    return NodeScrape.objects.select_related("node__cluster").order_by(
        "node__cluster_id", "node__position", "node_id"
    )


def freshness_s(*, cluster: Cluster) -> float:
    """How old measured values may be and still stand in for the prediction, seconds."""
    return STALE_INTERVALS * source_settings(cluster=cluster).interval_s


def job_series(*, job: Job, since: datetime | None = None, limit: int = 720) -> list[JobSample]:
    """The job's measured-and-predicted samples, oldest first (the last `limit`, since `since`)."""
    qs = JobSample.objects.filter(job=job)
    if since is not None:
        qs = qs.filter(at__gte=since)
    return list(reversed(qs.order_by("-at", "-id")[:limit]))


def job_aggregate(*, job: Job) -> dict:
    """The job's measures over its whole run so far: sample count, first and last time, and the
    means of utilisation, MFU, comm share and step time (None where nothing measured them)."""
    return JobSample.objects.filter(job=job).aggregate(
        samples=Count("id"),
        first=Min("at"),
        last=Max("at"),
        gpu_util=Avg("gpu_util"),
        mfu=Avg("mfu"),
        comm_share=Avg("comm_share"),
        step_ms=Avg("step_ms"),
    )


def job_latest_sample(*, job: Job, fresh_s: float | None = None) -> JobSample | None:
    """The job's newest sample (None if there is none, or none younger than `fresh_s`)."""
    qs = JobSample.objects.filter(job=job)
    if fresh_s is not None:
        qs = qs.filter(at__gte=timezone.now() - timedelta(seconds=fresh_s))
    return qs.order_by("-at", "-id").first()


def job_latest_report(*, job: Job) -> JobReport | None:
    """The job's newest own report."""
    return JobReport.objects.filter(job=job).order_by("-at", "-id").first()


def latest_samples_by_job(*, cluster: Cluster, fresh_s: float) -> dict[int, JobSample]:
    """job id -> its newest sample younger than `fresh_s`, for the cluster's jobs."""
    since = timezone.now() - timedelta(seconds=fresh_s)
    out: dict[int, JobSample] = {}
    for s in JobSample.objects.filter(job__cluster=cluster, at__gte=since).order_by("job_id", "-at", "-id"):
        out.setdefault(s.job_id, s)
    return out


def open_hotspots(*, cluster: Cluster | None = None, job: Job | None = None) -> QuerySet[Hotspot]:
    """Hotspots not closed yet, newest first."""
    # Uplink rows count intervals before they are hotspots (see uplinks.py).
    qs = Hotspot.objects.filter(closed_at__isnull=True, intervals__gte=HOTSPOT_INTERVALS).select_related(
        "job", "proposal", "cluster"
    )
    if cluster is not None:
        qs = qs.filter(cluster=cluster)
    if job is not None:
        qs = qs.filter(job=job)
    return qs.order_by("-last_seen_at", "-id")

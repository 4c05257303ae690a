"""Metrics services: one collection pass (the beat task and `collect_metrics` alike), rollups and
retention, and a job's own report."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Avg, Count
from django.db.models.functions import TruncMinute
from django.utils import timezone

from apps.scheduling.models import Job
from apps.topology.models import Cluster
from apps.topology.retry import retry_when_locked

from .choices import SourceKind
from .exposition import VALUE_FIELDS
from .hotspots import hotspots_detect
from .jobseries import job_samples_record
from .models import GpuRollup, GpuSample, JobReport, MetricsSource, UplinkSample
from .sources import Source
from .sources.dcgm import DcgmSource
from .sources.prometheus import PrometheusSource
from .store import STALE_INTERVALS, cluster_targets, results_store
from .uplinks import uplink_hotspots_detect

RAW_RETENTION_S = 3600.0
ROLLUP_RETENTION_S = 86400.0
DEFAULT_INTERVAL_S = 15.0
DEFAULT_TIMEOUT_S = 5.0


@dataclass(slots=True)
class CollectResult:
    """What one pass did, with the wall time of each stage in milliseconds."""

    cluster: str
    nodes_ok: int = 0
    nodes_failed: int = 0
    readings: int = 0
    jobs_measured: int = 0
    hotspots: int = 0
    stage_ms: dict[str, float] = field(default_factory=dict)
    parse_cpu_ms: float = 0.0


def source_settings(*, cluster: Cluster) -> MetricsSource:
    """The cluster's metrics source row, or an unsaved default (dcgm, 15 s, 5 s timeout)."""
    found = MetricsSource.objects.filter(cluster=cluster).first()
    return found or MetricsSource(
        cluster=cluster, kind=SourceKind.DCGM, interval_s=DEFAULT_INTERVAL_S, timeout_s=DEFAULT_TIMEOUT_S
    )


def source_for(settings: MetricsSource) -> Source:
    """The source object a MetricsSource row describes."""
    if settings.kind == SourceKind.PROMETHEUS:
        return PrometheusSource(
            url=settings.prometheus_url,
            node_label=settings.node_label,
            gpu_label=settings.gpu_label,
            node_suffix=settings.node_suffix,
            timeout_s=settings.timeout_s,
        )
    return DcgmSource(timeout_s=settings.timeout_s)


def metrics_collect(
    *, cluster: Cluster, source: Source | None = None, now: datetime | None = None
) -> CollectResult:
    """One pass over a cluster: fetch and parse every node (concurrently), store latest values,
    raw samples, NIC counters and node states, then the running jobs' samples and hotspots."""
    settings = source_settings(cluster=cluster)
    source = source or source_for(settings)
    out = CollectResult(cluster.name)
    t0 = time.perf_counter()
    targets = cluster_targets(cluster=cluster)
    results = source.collect(targets)
    t1 = time.perf_counter()
    # Parsing overlaps fetching (and may run in other processes): the wall time is one stage,
    # the parsers' own time is reported beside it.
    out.stage_ms["fetch_parse"] = (t1 - t0) * 1e3
    out.parse_cpu_ms = sum(r.parse_ms for r in results)
    now = now or timezone.now()
    stored = retry_when_locked(
        lambda: results_store(cluster=cluster, results=results, now=now, interval_s=settings.interval_s),
        what="metrics store",
    )
    t2 = time.perf_counter()
    out.stage_ms["store"] = (t2 - t1) * 1e3
    out.nodes_ok, out.nodes_failed, out.readings = stored.nodes_ok, stored.nodes_failed, stored.readings
    fresh_s = STALE_INTERVALS * settings.interval_s
    samples = retry_when_locked(
        lambda: job_samples_record(cluster=cluster, now=now, fresh_s=fresh_s), what="job samples"
    )
    out.jobs_measured = len(samples)
    out.hotspots = len(
        retry_when_locked(
            lambda: hotspots_detect(
                cluster=cluster, samples=samples, now=now, interval_s=settings.interval_s
            ),
            what="hotspots",
        )
    )
    out.hotspots += len(
        retry_when_locked(
            lambda: uplink_hotspots_detect(cluster=cluster, now=now, fresh_s=fresh_s), what="uplink hotspots"
        )
    )
    out.stage_ms["jobs"] = (time.perf_counter() - t2) * 1e3
    return out


def metrics_rollup(*, now: datetime | None = None) -> int:
    """Fold the raw samples of every finished minute not yet rolled up into per-minute means;
    returns how many rollup rows were written. Safe to run again (existing minutes are kept)."""
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0)
    last = GpuRollup.objects.order_by("-minute").values_list("minute", flat=True).first()
    start = last + timedelta(minutes=1) if last else end - timedelta(seconds=RAW_RETENTION_S)
    if start >= end:
        return 0
    rows = (
        GpuSample.objects.filter(at__gte=start, at__lt=end)
        .annotate(bucket=TruncMinute("at"))
        .values("gpu_id", "instance", "bucket")
        .annotate(n=Count("id"), **{f"avg_{f}": Avg(f) for f in VALUE_FIELDS})
    )
    rollups = [
        GpuRollup(
            gpu_id=r["gpu_id"],
            instance=r["instance"],
            minute=r["bucket"],
            samples=min(r["n"], 32767),
            **{f: r[f"avg_{f}"] for f in VALUE_FIELDS},
        )
        for r in rows
    ]
    GpuRollup.objects.bulk_create(rollups, batch_size=2000, ignore_conflicts=True)
    return len(rollups)


def metrics_retain(*, now: datetime | None = None) -> dict[str, int]:
    """Delete raw samples older than an hour, rollups and uplink samples older than a day
    (per-job samples and reports stay with their job). Returns rows deleted per table."""
    now = now or timezone.now()
    raw, _ = GpuSample.objects.filter(at__lt=now - timedelta(seconds=RAW_RETENTION_S)).delete()
    rolled, _ = GpuRollup.objects.filter(minute__lt=now - timedelta(seconds=ROLLUP_RETENTION_S)).delete()
    uplink, _ = UplinkSample.objects.filter(at__lt=now - timedelta(seconds=ROLLUP_RETENTION_S)).delete()
    return {"raw": raw, "rollup": rolled, "uplink": uplink}


REPORT_LIMITS = {
    "step_ms": (0.0, 86_400_000.0),
    "tokens_per_step": (0.0, 1e12),
    "flops_per_step": (0.0, 1e24),
    "comm_ms": (0.0, 86_400_000.0),
}


def job_report_record(
    *,
    job: Job,
    step_ms: float,
    tokens_per_step: float | None = None,
    flops_per_step: float | None = None,
    comm_ms: float | None = None,
    override_by=None,
) -> JobReport:
    """Store a running job's own report (step and comm time in ms, FLOPs and tokens per step).
    ValidationError naming the field when a value is outside its range or comm exceeds the step.
    `override_by`: the operator reporting in the owner's place; recorded in the admin's log."""
    values = {
        "step_ms": step_ms,
        "tokens_per_step": tokens_per_step,
        "flops_per_step": flops_per_step,
        "comm_ms": comm_ms,
    }
    errors = {}
    for name, value in values.items():
        low, high = REPORT_LIMITS[name]
        if value is None:
            continue
        if not (isinstance(value, int | float) and math.isfinite(value) and low <= value <= high):
            errors[name] = f"must be a number in {low:g}..{high:g}, got {value!r}"
    if "step_ms" not in errors and not step_ms > 0:
        errors["step_ms"] = "must be positive"
    if not errors and comm_ms is not None and comm_ms > step_ms:
        errors["comm_ms"] = f"{comm_ms:g} ms of communication cannot exceed the {step_ms:g} ms step"
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        report = JobReport.objects.create(job=job, **values)
        if override_by is not None:
            LogEntry.objects.log_actions(
                user_id=override_by.pk,
                queryset=[job],
                action_flag=CHANGE,
                change_message=f"reported metrics in the owner's place: report {report.pk}, "
                + ", ".join(f"{k}={v:g}" for k, v in values.items() if v is not None),
                single_object=True,
            )
    return report

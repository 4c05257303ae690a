"""Per-job series: after each pass, one JobSample per running job from its GPUs' fresh latest
values, its latest report and its current predictions."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Count

from apps.scheduling.choices import JobStatus
from apps.scheduling.models import Allocation, Job
from apps.topology.models import Cluster, Node

from .measures import Report, exposed_share, job_measure
from .models import GpuLatest, JobReport, JobSample, NicLatest

REPORT_FRESH_S = 120.0  # a report older than this no longer speaks for the job


def spec_numbers(spec: dict) -> tuple[float | None, float]:
    """(flops_per_step, compute_ms) of a stored job spec v1."""
    flops = (spec.get("model") or {}).get("flops_per_step")
    compute_ms = float((spec.get("step") or {}).get("compute_ms") or 0.0)
    return (None if flops is None else float(flops)), compute_ms


def latest_reports(job_ids, since: datetime) -> dict[int, Report]:
    """Each job's newest report since `since`."""
    out: dict[int, Report] = {}
    rows = (
        JobReport.objects.filter(job_id__in=job_ids, at__gte=since)
        .order_by("job_id", "-at")
        .values_list("job_id", "step_ms", "flops_per_step", "comm_ms")
    )
    for job_id, step_ms, flops, comm_ms in rows:
        out.setdefault(job_id, Report(step_ms, flops, comm_ms))
    return out


def job_samples_record(*, cluster: Cluster, now: datetime, fresh_s: float) -> list[JobSample]:
    """Record one JobSample per running job of the cluster that has fresh GPU values or a fresh
    report (values younger than `fresh_s` seconds); returns them."""
    jobs = {
        j.pk: j
        for j in Job.objects.filter(cluster=cluster, status=JobStatus.RUNNING).only(
            "id", "spec", "gpus", "predicted_mfu", "predicted_step_ms"
        )
    }
    if not jobs:
        return []
    gpus_of: dict[int, list[int]] = defaultdict(list)
    nodes_of: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    peak_of: dict[int, float] = {}
    for job_id, gpu_id, node_id, peak in Allocation.objects.filter(live=True, job_id__in=jobs).values_list(
        "job_id", "gpu_id", "gpu__node_id", "gpu__node__gpu_model__peak_tflops"
    ):
        gpus_of[job_id].append(gpu_id)
        nodes_of[job_id][node_id] += 1
        peak_of[job_id] = peak
    since = now - timedelta(seconds=fresh_s)
    all_gpus = [g for gs in gpus_of.values() for g in gs]
    latest = {
        row[0]: row[1:]
        for row in GpuLatest.objects.filter(gpu_id__in=all_gpus, instance="", at__gte=since).values_list(
            "gpu_id", "gpu_util", "tensor_active", "nvlink_tx_Bps", "nvlink_rx_Bps", "power_W"
        )
    }
    nic_Bps: dict[int, float] = defaultdict(float)
    node_ids = {n for per in nodes_of.values() for n in per}
    for node_id, tx in NicLatest.objects.filter(node_id__in=node_ids, at__gte=since).values_list(
        "node_id", "tx_Bps"
    ):
        if tx is not None:
            nic_Bps[node_id] += tx
    node_gpus = _node_gpu_counts(node_ids)
    reports = latest_reports(list(jobs), now - timedelta(seconds=REPORT_FRESH_S))
    samples = []
    for job_id, job in jobs.items():
        values = [latest[g] for g in gpus_of.get(job_id, ()) if g in latest]
        report = reports.get(job_id)
        if not values and report is None:
            continue
        flops, compute_ms = spec_numbers(job.spec)
        m = job_measure(
            gpu_util=[v[0] for v in values],
            tensor_active=[v[1] for v in values],
            gpus=job.gpus,
            peak_tflops=peak_of.get(job_id, 0.0),
            flops_per_step=flops,
            compute_ms=compute_ms,
            report=report,
        )
        nvlink = [(v[2] or 0.0) + (v[3] or 0.0) for v in values if v[2] is not None or v[3] is not None]
        # A node's NIC traffic is shared by its jobs in proportion to the GPUs each holds there.
        nic = sum(nic_Bps[n] * k / node_gpus[n] for n, k in nodes_of[job_id].items() if n in nic_Bps)
        samples.append(
            JobSample(
                job_id=job_id,
                at=now,
                gpus_measured=m.gpus_measured,
                gpu_util=m.gpu_util,
                tensor_active=m.tensor_active,
                mfu=m.mfu,
                mfu_source=m.mfu_source,
                comm_share=m.comm_share,
                comm_source=m.comm_source,
                step_ms=m.step_ms,
                nvlink_Bps=sum(nvlink) if nvlink else None,
                nic_Bps=nic if any(n in nic_Bps for n in nodes_of[job_id]) else None,
                power_W=sum(v[4] for v in values if v[4] is not None) or None,
                predicted_mfu=job.predicted_mfu,
                predicted_comm_share=exposed_share(job.predicted_step_ms, compute_ms),
                predicted_step_ms=job.predicted_step_ms,
            )
        )
    JobSample.objects.bulk_create(samples, batch_size=1000)
    return samples


def _node_gpu_counts(node_ids) -> dict[int, int]:
    return dict(Node.objects.filter(pk__in=node_ids).annotate(n=Count("gpus")).values_list("pk", "n"))

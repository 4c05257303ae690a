"""Measured values for the dashboard: per busy GPU for the cluster overlays (served as JSON and
polled by the page), per job for the tables, and the job page's series. Values older than the
cluster's freshness window are not shown as measured: the prediction stands in, and says so."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from apps.metrics import selectors as metrics
from apps.metrics.models import GpuLatest, JobSample, NicLatest
from apps.metrics.uplinks import leaf_uplink_loads
from apps.scheduling.models import Allocation
from apps.topology.models import Cluster


@dataclass(frozen=True, slots=True)
class JobMeasured:
    """A job's newest fresh measurement for a table row; `age_s` seconds old."""

    sample: JobSample
    age_s: float


def jobs_measured(*, cluster: Cluster) -> dict[int, JobMeasured]:
    """job id -> its newest measurement younger than the freshness window."""
    now = timezone.now()
    fresh = metrics.latest_samples_by_job(cluster=cluster, fresh_s=metrics.freshness_s(cluster=cluster))
    return {j: JobMeasured(s, (now - s.at).total_seconds()) for j, s in fresh.items()}


def overlay_values(*, cluster: Cluster, topology) -> dict:
    """Measured overlay values per busy GPU (gid): utilisation from its own DCGM values, MFU and
    comm share from its job's newest sample; with the newest measurement's age in seconds."""
    fresh_s = metrics.freshness_s(cluster=cluster)
    now = timezone.now()
    per_job = metrics.latest_samples_by_job(cluster=cluster, fresh_s=fresh_s)
    rows = Allocation.objects.filter(live=True, job__cluster=cluster).values_list(
        "job_id", "gpu_id", "gpu__node__name", "gpu__index"
    )
    since = now - timedelta(seconds=fresh_s)
    util = dict(
        GpuLatest.objects.filter(gpu__node__cluster=cluster, instance="", at__gte=since).values_list(
            "gpu_id", "gpu_util"
        )
    )
    newest = None
    out = {"gids": [], "util": [], "mfu": [], "comm": []}
    for job_id, gpu_id, node, index in rows:
        sample = per_job.get(job_id)
        u = util.get(gpu_id)
        if sample is None and u is None:
            continue
        out["gids"].append(topology.gid(node, index))
        out["util"].append(None if u is None else round(u, 4))
        out["mfu"].append(None if sample is None or sample.mfu is None else round(sample.mfu, 4))
        out["comm"].append(
            None if sample is None or sample.comm_share is None else round(sample.comm_share, 4)
        )
        if sample is not None and (newest is None or sample.at > newest):
            newest = sample.at
    out["age_s"] = None if newest is None else round((now - newest).total_seconds(), 1)
    out["fresh_s"] = fresh_s
    out.update(link_values(cluster=cluster, topology=topology, since=since, now=now, fresh_s=fresh_s))
    return out


def link_values(*, cluster: Cluster, topology, since, now, fresh_s: float) -> dict:
    """Measured link loads: each NIC's transmit rate in GB/s (by NIC number, node by node in file
    order, as the graph numbers them; ports of one device summed) and each leaf's uplink load as
    a share of its uplink capacity (apps.metrics.uplinks); empty without fresh NIC counters."""
    rates = list(
        NicLatest.objects.filter(node__cluster=cluster, at__gte=since, tx_Bps__isnull=False).values_list(
            "node__name", "device", "tx_Bps"
        )
    )
    if not rates:
        return {"nic_GBps": {}, "leaf_uplink": {}}
    first: dict[str, int] = {}
    n = 0
    for node in topology.nodes:
        first[node.name] = n
        n += len(node.nics)
    nic_pos = {
        (node.name, nic.name): first[node.name] + k
        for node in topology.nodes
        for k, nic in enumerate(node.nics)
    }
    nic_GBps: dict[str, float] = {}
    for node, device, tx in rates:
        k = nic_pos.get((node, device))
        if k is not None:
            nic_GBps[str(k)] = round(nic_GBps.get(str(k), 0.0) + tx / 1e9, 4)
    leaf_share, _ = leaf_uplink_loads(cluster=cluster, now=now, fresh_s=fresh_s)
    return {"nic_GBps": nic_GBps, "leaf_uplink": {k: round(v, 4) for k, v in leaf_share.items()}}


def job_series_points(*, job) -> dict[str, list]:
    """The job page's chart points: (time, value) per measured and predicted quantity."""
    series = metrics.job_series(job=job)
    pick = {
        "mfu": lambda s: s.mfu,
        "util": lambda s: s.gpu_util,
        "comm": lambda s: s.comm_share,
        "predicted_mfu": lambda s: s.predicted_mfu,
        "predicted_comm": lambda s: s.predicted_comm_share,
    }
    return {k: [(s.at, f(s)) for s in series if f(s) is not None] for k, f in pick.items()}

"""Hotspots from measured data: a running job whose measured exposed communication share exceeds
its prediction by COMM_EXCESS for HOTSPOT_INTERVALS consecutive collections gets a hotspot and a
migration proposal carrying the measured evidence; the hotspot closes once a collection measures
the job back within the threshold."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from apps.scheduling.choices import ProposalStatus
from apps.scheduling.models import Job
from apps.scheduling.proposals import migration_propose_measured
from apps.topology.models import Cluster

from .choices import HotspotKind
from .models import Hotspot, JobSample

COMM_EXCESS = 0.05  # absolute: measured share 0.58 against 0.52 predicted is over
HOTSPOT_INTERVALS = 3


def _excess(sample: JobSample) -> float | None:
    if sample.comm_share is None or sample.predicted_comm_share is None:
        return None
    return sample.comm_share - sample.predicted_comm_share


def _evidence(samples: Sequence[JobSample]) -> dict:
    last = samples[0]
    return {
        "comm_share": [round(s.comm_share, 4) for s in reversed(samples)],
        "predicted_comm_share": round(last.predicted_comm_share, 4),
        "comm_source": last.comm_source,
        "mfu": None if last.mfu is None else round(last.mfu, 4),
        "mfu_source": last.mfu_source,
        "predicted_mfu": None if last.predicted_mfu is None else round(last.predicted_mfu, 4),
        "gpu_util": None if last.gpu_util is None else round(last.gpu_util, 4),
        "step_ms": None if last.step_ms is None else round(last.step_ms, 2),
        "predicted_step_ms": None if last.predicted_step_ms is None else round(last.predicted_step_ms, 2),
        "nic_Bps": last.nic_Bps,
        "nvlink_Bps": last.nvlink_Bps,
        "at": [s.at.isoformat() for s in reversed(samples)],
    }


def _summary(evidence: dict, intervals: int) -> str:
    shares = ", ".join(f"{v:.0%}" for v in evidence["comm_share"])
    return (
        f"comm share {shares} over the last {intervals} intervals ({evidence['comm_source']}) against"
        f" {evidence['predicted_comm_share']:.0%} predicted"
    )


def hotspots_detect(*, cluster: Cluster, samples: Sequence[JobSample], now: datetime) -> list[Hotspot]:
    """Open, extend or close comm-share hotspots from this pass's job samples; returns the open
    ones touched. A newly opened hotspot gets (or links) a migration proposal."""
    open_by_job = {
        h.job_id: h
        for h in Hotspot.objects.filter(cluster=cluster, kind=HotspotKind.COMM_SHARE, closed_at__isnull=True)
    }
    over, within = [], []
    for s in samples:
        excess = _excess(s)
        if excess is None:
            continue
        (over if excess >= COMM_EXCESS else within).append(s.job_id)
    Hotspot.objects.filter(pk__in=[open_by_job[j].pk for j in within if j in open_by_job]).update(
        closed_at=now
    )
    touched = []
    jobs = Job.objects.in_bulk(over)
    for job_id in over:
        recent = list(JobSample.objects.filter(job_id=job_id).order_by("-at", "-id")[:HOTSPOT_INTERVALS])
        if len(recent) < HOTSPOT_INTERVALS or any((_excess(s) or 0.0) < COMM_EXCESS for s in recent):
            continue
        hotspot = open_by_job.get(job_id) or Hotspot(
            cluster=cluster,
            kind=HotspotKind.COMM_SHARE,
            job_id=job_id,
            opened_at=now,
            intervals=HOTSPOT_INTERVALS - 1,
        )
        hotspot.intervals += 1
        hotspot.last_seen_at = now
        hotspot.evidence = _evidence(recent)
        if hotspot.proposal_id is None or hotspot.proposal.status != ProposalStatus.PROPOSED:
            hotspot.proposal = migration_propose_measured(
                job=jobs[job_id], evidence=_summary(hotspot.evidence, HOTSPOT_INTERVALS)
            )
        hotspot.save()
        touched.append(hotspot)
    return touched

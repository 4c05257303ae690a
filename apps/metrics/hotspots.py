"""Hotspots from measured data: a running job whose measured exposed communication share exceeds
its prediction by COMM_EXCESS for HOTSPOT_INTERVALS consecutive collections gets a hotspot and a
migration proposal carrying the measured evidence; the hotspot closes once a collection measures
the job back within the threshold, or once the job no longer runs (failed, completed, cancelled,
preempted). A hotspot without a better placement asks again every
RETRY_INTERVALS collections, not every one."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from apps.scheduling.choices import ACTIVE_STATUSES, ProposalStatus
from apps.scheduling.models import Job
from apps.scheduling.proposals import migrations_propose_measured
from apps.topology.models import Cluster

from .choices import HotspotKind
from .models import Hotspot, JobSample

COMM_EXCESS = 0.05  # absolute: measured share 0.58 against 0.52 predicted is over
HOTSPOT_INTERVALS = 3
RETRY_INTERVALS = 20


def _excess(sample: JobSample) -> float | None:
    if sample.comm_share is None or sample.predicted_comm_share is None:
        return None
    return sample.comm_share - sample.predicted_comm_share


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _evidence(samples: Sequence[JobSample]) -> dict:
    last = samples[0]
    return {
        "comm_share": [round(s.comm_share, 4) for s in reversed(samples)],
        "predicted_comm_share": round(last.predicted_comm_share, 4),
        "comm_source": last.comm_source,
        "mfu": _rounded(last.mfu),
        "mfu_source": last.mfu_source,
        "predicted_mfu": _rounded(last.predicted_mfu),
        "gpu_util": _rounded(last.gpu_util),
        "step_ms": _rounded(last.step_ms, 2),
        "predicted_step_ms": _rounded(last.predicted_step_ms, 2),
        "nic_Bps": last.nic_Bps,
        "nvlink_Bps": last.nvlink_Bps,
        "at": [s.at.isoformat() for s in reversed(samples)],
    }


def _summary(evidence: dict) -> str:
    shares = ", ".join(f"{v:.0%}" for v in evidence["comm_share"])
    return (
        f"comm share {shares} over the last {len(evidence['comm_share'])} intervals ({evidence['comm_source']})"
        f" against {evidence['predicted_comm_share']:.0%} predicted"
    )


def _recent(job_ids: list[int], now: datetime, interval_s: float) -> dict[int, list[JobSample]]:
    """Each job's newest HOTSPOT_INTERVALS samples, newest first (one query)."""
    since = now - timedelta(seconds=2 * HOTSPOT_INTERVALS * interval_s)
    out: dict[int, list[JobSample]] = defaultdict(list)
    for s in JobSample.objects.filter(job_id__in=job_ids, at__gte=since).order_by("job_id", "-at", "-id"):
        if len(out[s.job_id]) < HOTSPOT_INTERVALS:
            out[s.job_id].append(s)
    return out


def hotspots_detect(
    *, cluster: Cluster, samples: Sequence[JobSample], now: datetime, interval_s: float
) -> list[Hotspot]:
    """Open, extend or close comm-share hotspots from this pass's job samples; returns the open
    ones touched. A newly opened hotspot gets (or links) a migration proposal."""
    open_by_job = {
        h.job_id: h
        for h in Hotspot.objects.filter(
            cluster=cluster, kind=HotspotKind.COMM_SHARE, closed_at__isnull=True
        ).select_related("proposal")
    }
    # A job that no longer runs (failed, completed, cancelled, preempted) has no samples: its
    # hotspot would stay open for ever. It closes now.
    active = set(
        Job.objects.filter(pk__in=list(open_by_job), status__in=ACTIVE_STATUSES).values_list("pk", flat=True)
    )
    gone = [j for j in open_by_job if j not in active]
    Hotspot.objects.filter(pk__in=[open_by_job.pop(j).pk for j in gone]).update(closed_at=now)
    over, within = [], []
    for s in samples:
        excess = _excess(s)
        if excess is not None:
            (over if excess >= COMM_EXCESS else within).append(s.job_id)
    Hotspot.objects.filter(pk__in=[open_by_job[j].pk for j in within if j in open_by_job]).update(
        closed_at=now
    )
    recent = _recent(over, now, interval_s)
    touched, asking = [], {}
    for job_id in over:
        rows = recent.get(job_id, [])
        if len(rows) < HOTSPOT_INTERVALS or any((_excess(s) or 0.0) < COMM_EXCESS for s in rows):
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
        hotspot.evidence = _evidence(rows)
        decided = hotspot.proposal is not None and hotspot.proposal.status != ProposalStatus.PROPOSED
        retry = hotspot.proposal is None and (hotspot.intervals - HOTSPOT_INTERVALS) % RETRY_INTERVALS == 0
        if hotspot.pk is None or decided or retry:
            asking[job_id] = _summary(hotspot.evidence)
        touched.append(hotspot)
    proposals = migrations_propose_measured(cluster=cluster, evidence=asking) if asking else {}
    for hotspot in touched:
        if hotspot.job_id in proposals:
            hotspot.proposal = proposals[hotspot.job_id]
    new = [h for h in touched if h.pk is None]
    Hotspot.objects.bulk_create(new)
    Hotspot.objects.bulk_update(
        [h for h in touched if h not in new],
        ["intervals", "last_seen_at", "evidence", "proposal"],
        batch_size=500,
    )
    return touched

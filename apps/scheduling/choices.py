"""Enumerations of the scheduling app (job and proposal status machines, cycle outcomes)."""

from django.db import models


class JobStatus(models.TextChoices):
    """A job's place in its life.

    queued -> placing (GPUs allocated by a cycle, the launcher has not started it yet) -> running
    -> completed | failed. A queued, placing or running job can be cancelled. A placing or running
    job can be preempted: its GPUs are released and it waits again; `preempted` counts as queued
    (the cycle walks queued and preempted jobs alike, by priority then original submission time),
    and the next placement moves it to placing. A queued or preempted job that the cycle cannot
    evaluate (its placement or cost model raises, or its stored spec no longer loads) goes to
    failed, its `pending_reason` starting "failed to schedule:"; the cycle goes on with the others.
    """

    QUEUED = "queued", "queued"
    PLACING = "placing", "placing"
    RUNNING = "running", "running"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    PREEMPTED = "preempted", "preempted"


# Jobs the cycle tries to place.
WAITING_STATUSES = (JobStatus.QUEUED, JobStatus.PREEMPTED)
# Jobs that hold live allocations.
ACTIVE_STATUSES = (JobStatus.PLACING, JobStatus.RUNNING)
# Jobs that will never hold GPUs again.
FINISHED_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


class CycleStatus(models.TextChoices):
    """Outcome of one scheduling cycle."""

    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"


class ProposalStatus(models.TextChoices):
    """A migration proposal: proposed -> applied | rejected | stale (target GPUs taken, job gone)."""

    PROPOSED = "proposed", "proposed"
    APPLIED = "applied", "applied"
    REJECTED = "rejected", "rejected"
    STALE = "stale", "stale"

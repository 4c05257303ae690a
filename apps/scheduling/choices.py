"""Enumerations of the scheduling app (job and proposal status machines, cycle outcomes)."""

from django.db import models


class JobStatus(models.TextChoices):
    """A job's place in its life.

    queued -> placing (GPUs allocated by a cycle, the launcher has not started it yet) -> running
    -> completed | failed. Applying a migration moves a running job to migrating (the old
    generation stops, then the new one starts: back to placing, then running). A queued, placing or running job can be cancelled. A placing or running
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
    MIGRATING = "migrating", "migrating"


# Jobs the cycle tries to place.
WAITING_STATUSES = (JobStatus.QUEUED, JobStatus.PREEMPTED)
# Jobs that hold live allocations (a migrating one: its old generation's, until its ranks exited).
ACTIVE_STATUSES = (JobStatus.PLACING, JobStatus.RUNNING, JobStatus.MIGRATING)
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


class NodeState(models.TextChoices):
    """A node's health: up; draining (no new placements, running jobs finish) -> drained; down
    (missed heartbeats: its GPUs leave the free set, its jobs fail or requeue)."""

    UP = "up", "up"
    DRAINING = "draining", "draining"
    DRAINED = "drained", "drained"
    DOWN = "down", "down"


# Nodes whose GPUs take no new placements.
UNSCHEDULABLE_NODE_STATES = (NodeState.DRAINING, NodeState.DRAINED, NodeState.DOWN)


class RankState(models.TextChoices):
    """A rank process as its agent reported it."""

    STARTED = "started", "started"
    EXITED = "exited", "exited"

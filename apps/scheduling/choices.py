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

# A node as the pages, the API and the CLI show it: its agent's state, or "no_agent" when no agent
# ever reported (an up row without a heartbeat, or no row at all).
NO_AGENT = "no_agent"
SHOWN_NODE_STATES = (
    NodeState.UP.value,
    NodeState.DRAINING.value,
    NodeState.DRAINED.value,
    NodeState.DOWN.value,
    NO_AGENT,
)
# What the node lists filter by: a shown state, or "unhealthy" (a GPU reported unhealthy).
UNHEALTHY = "unhealthy"
NODE_STATE_FILTERS = (*SHOWN_NODE_STATES, UNHEALTHY)


class RankState(models.TextChoices):
    """A rank process as its agent reported it."""

    STARTED = "started", "started"
    EXITED = "exited", "exited"


class ExitCause(models.TextChoices):
    """Why a rank exited, apart from its exit code. Only `exited`, the two limits and `refused`
    are the job's own doing: a rank that ended otherwise (its agent lost track of it, fenced or
    stopped it, or its node went down) sends a `requeue: true` job back to the queue, within
    its `max_requeues`."""

    EXITED = "exited", "exited"
    LOST = "lost", "lost"
    FENCED = "fenced", "fenced"
    STOPPED = "stopped", "stopped"
    PIDS_LIMIT = "pids_limit", "pids limit"
    MEMORY_LIMIT = "memory_limit", "memory limit"
    REFUSED = "refused", "refused"
    NODE_DOWN = "node_down", "node down"


# Exits that are not the job's fault: they requeue a `requeue: true` job.
INFRA_EXIT_CAUSES = (ExitCause.LOST, ExitCause.FENCED, ExitCause.STOPPED, ExitCause.NODE_DOWN)

EXIT_CAUSE_HELP = {
    ExitCause.EXITED: "The rank's own exit (its code says how).",
    ExitCause.LOST: "Its node agent lost track of it (no record, or its shim was killed); its exit status is unknown.",
    ExitCause.FENCED: "Its node agent stopped it, having had no contact with the server for its lease.",
    ExitCause.STOPPED: "Stopped by TopoWeb: its job ended, was requeued or migrated.",
    ExitCause.PIDS_LIMIT: "It ran into its limit of processes and threads (pids_max).",
    ExitCause.MEMORY_LIMIT: "The kernel's OOM killer killed it at its memory limit (memory_mb).",
    ExitCause.REFUSED: "Its node agent refused to start it (no such account, uid 0, a workdir outside the allowed roots).",
    ExitCause.NODE_DOWN: "Its node went down and its fence deadline passed: the rank is gone with it.",
}


# What each status means, for people: the dashboard's tooltips and glossary, and the API schema.
JOB_STATUS_HELP = {
    JobStatus.QUEUED: "Waiting for GPUs: each scheduling cycle tries to place it, by priority then age; "
    "the pending reason says what is missing.",
    JobStatus.PLACING: "GPUs are booked for every rank; the launcher or the node agents have not "
    "started all its ranks yet.",
    JobStatus.RUNNING: "Every rank started on its booked GPU; the job holds its GPUs until it ends.",
    JobStatus.MIGRATING: "A migration was applied: the old generation's ranks are stopping, its GPUs "
    "stay booked until every old rank exited, then the new placement starts (back to placing).",
    JobStatus.PREEMPTED: "A higher-priority job took its GPUs; it waits again like a queued job and "
    "keeps its original submission time.",
    JobStatus.COMPLETED: "Every rank exited with code 0; its GPUs were released.",
    JobStatus.FAILED: "A rank exited with an error or ran into a limit, a fault not its own ended a "
    "rank of a job without requeue: true (or past its max_requeues), or the scheduler could not "
    "evaluate it; the reason says which. Its GPUs were released.",
    JobStatus.CANCELLED: "Cancelled by its owner or an operator before it finished; its GPUs were released.",
}

NODE_STATE_HELP = {
    NodeState.UP: "Heartbeats arrive; its healthy GPUs take new placements.",
    NodeState.DRAINING: "An operator drained it: no new placements; the jobs on it run to their end.",
    NodeState.DRAINED: "Drained and empty: no job runs on it and none will be placed until it is resumed.",
    NodeState.DOWN: "Heartbeats stopped: its GPUs left the free set; its jobs run on until its fence deadline, then fail or requeue.",
    NO_AGENT: "No agent ever reported from it: it still takes placements (an outside launcher may run "
    "its jobs), but nothing says it is alive.",
    UNHEALTHY: "Its agent reported one or more GPUs unhealthy (an XID error, or missing from nvidia-smi): "
    "those GPUs take no placements until a healthy report or a resume.",
}

PROPOSAL_STATUS_HELP = {
    ProposalStatus.PROPOSED: "A better placement was found; an operator may apply or reject it.",
    ProposalStatus.APPLIED: "Applied: the job moved (or is moving) to the proposed GPUs.",
    ProposalStatus.REJECTED: "An operator rejected it; the job stays where it is.",
    ProposalStatus.STALE: "No longer possible: the target GPUs were taken or the job changed.",
}


STATUS_HELP = {
    "job": JOB_STATUS_HELP,
    "node": NODE_STATE_HELP,
    "proposal": PROPOSAL_STATUS_HELP,
    "exit": EXIT_CAUSE_HELP,
}

"""Jobs, their GPU allocations, scheduling-cycle audit records, migration proposals, launcher tokens."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.deletion import RESTRICT, SET_NULL
from django.utils import timezone

from apps.topology.choices import PlacementPolicy
from apps.topology.models.base import NAME_MAX_LENGTH

from .choices import ACTIVE_STATUSES, CycleStatus, JobStatus, ProposalStatus

IDEMPOTENCY_KEY_MAX_LENGTH = 128


class Job(models.Model):
    """A gang-scheduled training job: the validated job spec v1 and its scheduling state.

    `policy` null means the cluster's policy; `placed_policy` is the one that actually placed it.
    Predicted costs are those of its current placement (milliseconds per step, MFU as a fraction);
    `flows` is its own heavy traffic per leaf uplink (key: leaf name) that the cycle adds to the
    link loads other jobs see.
    """

    name = models.CharField(max_length=200)
    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="jobs")
    # Indexed by job_owner_status and job_owner_submitted, which begin with it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs", db_index=False
    )
    spec = models.JSONField(help_text="The validated job spec v1.")
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    priority = models.IntegerField(default=0, help_text="Higher runs first.")
    # Null, as in the job spec, means "the cluster's policy"; "" would be a policy name.
    policy = models.CharField(max_length=32, choices=PlacementPolicy.choices, null=True, blank=True)  # noqa: DJ001
    gpus = models.PositiveIntegerField()
    estimated_runtime_s = models.FloatField(null=True, blank=True)
    time_limit_min = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The spec's time_limit_min: stopped and failed this long after its start.",
    )
    submitted_at = models.DateTimeField(default=timezone.now)
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    pending_reason = models.TextField(blank=True, default="")
    placed_policy = models.CharField(max_length=32, blank=True, default="")
    predicted_comm_ms = models.FloatField(null=True, blank=True)
    predicted_step_ms = models.FloatField(null=True, blank=True)
    predicted_mfu = models.FloatField(null=True, blank=True)
    predicted = models.JSONField(null=True, blank=True, help_text="The placement output's predicted block.")
    flows = models.JSONField(default=dict, blank=True, help_text="Own flows per leaf, GB/s-weighted.")
    overdue = models.BooleanField(default=False, help_text="Running past twice its estimated runtime.")
    held = models.BooleanField(
        default=False,
        help_text="Held by an operator or its account's coordinator: waiting, never placed until released.",
    )
    preemptions = models.PositiveIntegerField(default=0)
    requeues = models.PositiveIntegerField(
        default=0,
        help_text="Times it went back to the queue other than by preemption (a node lost, ranks"
        " fenced or lost, a start timeout); past its spec's max_requeues a fault fails it.",
    )
    # Kept apart from `pending_reason`, which every later cycle rewrites with why the job waits.
    requeue_reason = models.TextField(
        blank=True,
        default="",
        help_text="Why the job last went back to the queue (start timeout, node down, preemption).",
    )
    requeued_at = models.DateTimeField(null=True, blank=True)
    # Null when submitted without an Idempotency-Key; "" would be a key.
    idempotency_key = models.CharField(  # noqa: DJ001
        max_length=IDEMPOTENCY_KEY_MAX_LENGTH,
        null=True,
        blank=True,
        help_text="The submission's Idempotency-Key header: a retry with it returns this job.",
    )
    idempotency_digest = models.CharField(
        max_length=64, blank=True, default="", help_text="SHA-256 of the submitted body and cluster."
    )
    generation = models.PositiveIntegerField(
        default=0, help_text="Placements so far: each placement or applied migration starts a new one."
    )
    account = models.ForeignKey(
        "scheduling.Account",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="jobs",
        help_text="The account it was submitted as (its owner's default, or the one it named).",
    )
    qos = models.ForeignKey(
        "scheduling.Qos",
        on_delete=models.RESTRICT,
        null=True,
        blank=True,
        related_name="jobs",
        help_text="Its class of service (its account's default, or the one it named).",
    )
    borrowed = models.BooleanField(
        default=False,
        help_text="Placed beyond its account's running-GPU limit on idle GPUs: reclaimed first.",
    )

    class Meta:
        ordering = ["-priority", "submitted_at", "id"]
        indexes = [
            models.Index(fields=["cluster", "status"], name="job_cluster_status"),
            models.Index(fields=["owner", "status"], name="job_owner_status"),
            # The queue page's history of finished jobs in a time range.
            models.Index(fields=["finished_at"], name="job_finished_at"),
            # The API's job list, newest first (and the queue's age column) on a long history.
            models.Index(fields=["submitted_at", "id"], name="job_submitted"),
            # A user's own jobs newest first (the API's list for everyone who does not see all
            # jobs): the page is read from the index, not sorted from all their jobs.
            models.Index(fields=["owner", "submitted_at", "id"], name="job_owner_submitted"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="one_job_per_owner_idempotency_key",
            )
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}"

    @property
    def is_active(self) -> bool:
        """True while the job holds live allocations (placing or running)."""
        return self.status in ACTIVE_STATUSES

    def expected_end(self, now: datetime | None = None) -> datetime | None:
        """When its GPUs should free up: start (or placement) + estimated runtime; None if unknown."""
        begin = self.started_at or self.placed_at
        if not self.is_active or begin is None or self.estimated_runtime_s is None:
            return None
        return begin + timedelta(seconds=self.estimated_runtime_s)

    def past_time_limit(self, now: datetime) -> bool:
        """Running longer than its `time_limit_min` since it started."""
        return (
            self.time_limit_min is not None
            and self.started_at is not None
            and now - self.started_at > timedelta(minutes=self.time_limit_min)
        )

    def time_limit_reason(self, detail: str = "") -> str:
        """The reason a job stopped at its time limit gets, on every executor."""
        extra = f" ({detail})" if detail else ""
        return f"time limit: stopped after its time_limit_min of {self.time_limit_min} min{extra}"

    @property
    def overdue_reason(self) -> str:
        """Why the job is flagged overdue, or an empty string."""
        return self.overdue_text(self.overdue, self.started_at, self.estimated_runtime_s)

    @staticmethod
    def overdue_text(overdue: bool, started_at: datetime | None, runtime_s: float | None) -> str:
        """`overdue_reason` from the three fields it reads (the job list reads rows, not jobs)."""
        if not overdue or started_at is None or runtime_s is None:
            return ""
        ran_s = (timezone.now() - started_at).total_seconds()
        return f"running {ran_s:.0f} s, past twice its estimated runtime of {runtime_s:.0f} s; flagged, not stopped"


def keep_released_allocations(collector, field, sub_objs, using):
    """on_delete of `Allocation.gpu`: deleting a GPU that a live allocation holds is refused
    (as RESTRICT: unless the allocation goes too, with its job or cluster); a released allocation
    stays as job history, keeping its node and GPU by value, and only loses the link."""
    RESTRICT(collector, field, sub_objs.filter(live=True), using)
    SET_NULL(collector, field, sub_objs.filter(live=False), using)


keep_released_allocations.lazy_sub_objs = True


class Allocation(models.Model):
    """Rank `rank` of generation `generation` of `job` runs on `gpu`. `live` is False once the
    GPU was released, or while a migration's new rank waits for the old rank on that GPU to exit
    (`released_at` null).

    At most one live allocation per GPU (a partial unique constraint, on SQLite and Postgres
    alike): the last guard against double booking. `node_name`, `gpu_index` and `nic_name` copy
    the GPU's place when booked, so a finished job's placement survives a topology replace (which
    deletes the GPU rows and leaves `gpu` null on released allocations).
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    rank = models.PositiveIntegerField()
    gpu = models.ForeignKey(
        "topology.Gpu",
        on_delete=keep_released_allocations,
        null=True,
        blank=True,
        related_name="allocations",
    )
    node_name = models.CharField(
        max_length=NAME_MAX_LENGTH, blank=True, default="", help_text="The GPU's node, by value."
    )
    gpu_index = models.PositiveSmallIntegerField(
        default=0, help_text="The GPU's index on its node, by value."
    )
    nic_name = models.CharField(
        max_length=NAME_MAX_LENGTH, blank=True, default="", help_text="The GPU's NIC, by value."
    )
    live = models.BooleanField(default=True)
    generation = models.PositiveIntegerField(default=1, help_text="The job generation this rank belongs to.")
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    master_port = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Rank 0 only: the generation's MASTER_PORT, unique among the live generations on its node.",
    )

    class Meta:
        ordering = ["job", "rank"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(live=True), name="one_live_allocation_per_gpu"
            ),
            models.UniqueConstraint(
                fields=["job", "generation", "rank"], name="one_allocation_per_job_generation_rank"
            ),
            models.CheckConstraint(
                condition=Q(live=False) | Q(gpu__isnull=False), name="live_allocation_has_gpu"
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} rank {self.rank} -> gpu {self.gpu_id}"


class SchedulingCycle(models.Model):
    """Audit record of one scheduling cycle on one cluster.

    `skipped` maps job id (as a string) to why it is still waiting; `placed_jobs` and
    `preempted_jobs` list job ids; `failed_jobs` maps job id (as a string) to why the cycle could
    not evaluate it (it is now failed); `duration_ms` is wall time of the whole cycle.
    """

    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="cycles")
    started_at = models.DateTimeField(default=timezone.now)
    policy = models.CharField(max_length=32)
    duration_ms = models.FloatField(default=0.0)
    placed = models.PositiveIntegerField(default=0)
    placed_jobs = models.JSONField(default=list, blank=True)
    preempted_jobs = models.JSONField(default=list, blank=True)
    skipped = models.JSONField(default=dict, blank=True)
    failed_jobs = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=CycleStatus.choices, default=CycleStatus.COMPLETED)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["cluster", "started_at"], name="cycle_cluster_started")]

    def __str__(self) -> str:
        return f"cycle {self.pk} on cluster {self.cluster_id}: {self.placed} placed"


class MigrationProposal(models.Model):
    """A better placement for a running job: old and new rank mappings and the predicted gain.

    Mappings are lists of {"rank", "node", "gpu"}; `predicted_gain` is the fraction of step time
    saved, (old - new) / old; step times in milliseconds.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="migration_proposals")
    policy = models.CharField(max_length=32, choices=PlacementPolicy.choices, default=PlacementPolicy.TOPO)
    old_mapping = models.JSONField()
    new_mapping = models.JSONField()
    predicted_gain = models.FloatField()
    predicted_old_step_ms = models.FloatField()
    predicted_new_step_ms = models.FloatField()
    reason = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=ProposalStatus.choices, default=ProposalStatus.PROPOSED)
    created_at = models.DateTimeField(default=timezone.now)
    applied_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job"], condition=Q(status=ProposalStatus.PROPOSED), name="one_open_proposal_per_job"
            )
        ]

    def __str__(self) -> str:
        return f"proposal {self.pk} for job {self.job_id}: {self.predicted_gain:.0%}"


def _new_launcher_key() -> str:
    """The default of the key column before keys were hashed (migration 0001 names it)."""
    return secrets.token_hex(20)


LAUNCHER_KEY_PREFIX = "tl_"


def new_launcher_key() -> str:
    """A fresh launcher token key: `tl_` and 43 URL-safe characters."""
    return LAUNCHER_KEY_PREFIX + secrets.token_urlsafe(32)


class LauncherToken(models.Model):
    """A per-cluster credential for the launcher (`Authorization: Launcher <key>`): it may report
    job lifecycle events and write the topology of its own cluster only. As for node tokens, only
    the key's hash is stored (`node_key_hash`); `prefix` (its first characters) tells tokens apart
    in the admin, and the key itself is shown once, when it is created."""

    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="launcher_tokens")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="The key's first characters.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["cluster", "created_at"]

    def __str__(self) -> str:
        return f"launcher token {self.prefix}… for cluster {self.cluster_id}"


from .account_models import Account, AccountLimit, AccountMembership, Qos  # noqa: E402  (accounts)
from .node_models import (  # noqa: E402  (nodes and ranks)
    NodeHealth,
    NodeToken,
    RankLogChunk,
    RankRun,
    SyncPulse,
    UnixAccount,
)
from .occupancy_models import ClusterOccupancy, OccupancyChange  # noqa: E402  (kept occupancy)

__all__ = [
    "Account",
    "AccountLimit",
    "AccountMembership",
    "Allocation",
    "ClusterOccupancy",
    "Job",
    "LauncherToken",
    "MigrationProposal",
    "NodeHealth",
    "NodeToken",
    "OccupancyChange",
    "Qos",
    "RankLogChunk",
    "RankRun",
    "SchedulingCycle",
    "SyncPulse",
    "UnixAccount",
]

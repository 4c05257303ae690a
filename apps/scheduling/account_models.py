"""Accounts (teams) that share clusters: their members, fair-share weights and per-cluster limits.

Imported by `models.py` (Django finds models there). One concept in the manner of Slurm's
associations: a user belongs to any number of accounts, one of them their default; an account has
a share (its weight in fair share), the QOS its jobs may use and, per cluster, a limit on the GPUs
it holds at once and on the GPU-hours it spends in a trailing period, and whether it may borrow idle
GPUs beyond its running limit. A QOS (Slurm's quality of service) is a named class of service on
one cluster: a priority term, limits per job, per user and per account, and whether its jobs may
borrow idle GPUs and may be preempted by other QOS's jobs.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

MAX_SHARE = 1_000_000
MAX_PERIOD_H = 24 * 366
MAX_COUNT = 10_000_000
MAX_QOS_PRIORITY = 1_000_000
MAX_WALL_S = 366 * 24 * 3600.0
DEFAULT_QOS = "normal"


def _count(help_text: str) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(MAX_COUNT)], help_text=help_text
    )


class GroupLimits(models.Model):
    """The limits an account (on one cluster, `AccountLimit`) and a QOS (`Qos`) both set on all
    their jobs together, blank meaning none: GPUs and jobs held at once (Slurm's GrpTRES=gres/gpu
    and GrpJobs), GPU-hours in a trailing period (GrpTRESMins, charged ahead), and whether their
    jobs may run beyond the running limits on idle GPUs, as borrowed capacity."""

    max_running_gpus = _count("GPUs all its jobs may hold at once (GrpTRES=gres/gpu).")
    max_running_jobs = _count("Jobs of it that may run at once (GrpJobs).")
    gpu_hours_per_period = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1e9)],
        help_text="GPU-hours all its jobs may use in the trailing period, charged ahead (GrpTRESMins).",
    )
    period_h = models.FloatField(
        default=24.0,
        validators=[MinValueValidator(1.0), MaxValueValidator(MAX_PERIOD_H)],
        help_text="Length of the trailing period, in hours.",
    )
    may_borrow = models.BooleanField(
        default=False,
        help_text="Beyond its running limits its jobs may run on idle GPUs, as borrowed capacity"
        " (preempted first when others need them).",
    )

    class Meta:
        abstract = True


class Qos(GroupLimits):
    """A class of service on one cluster (Slurm's QOS): its jobs' priority term, their limits
    (blank: none) and how they share capacity. Every cluster has `normal`, without limits."""

    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="qos")
    name = models.SlugField(max_length=64)
    priority = models.IntegerField(
        default=0,
        validators=[MinValueValidator(-MAX_QOS_PRIORITY), MaxValueValidator(MAX_QOS_PRIORITY)],
        help_text="Added to its jobs' effective priority (times TOPOWEB_PRIORITY_WEIGHT_QOS).",
    )
    max_gpus_per_job = _count("GPUs one job of this QOS may ask for (MaxTRESPerJob).")
    max_running_gpus_per_user = _count("GPUs one user's jobs of this QOS may hold at once (MaxTRESPerUser).")
    max_running_jobs_per_user = _count("Jobs of one user in this QOS that may run at once (MaxJobsPerUser).")
    max_running_gpus_per_account = _count(
        "GPUs one account's jobs of this QOS may hold at once (MaxTRESPerAccount)."
    )
    max_running_jobs_per_account = _count(
        "Jobs of one account in this QOS that may run at once (MaxJobsPerAccount)."
    )
    max_queued_per_user = _count("Jobs of one user in this QOS that may wait at once (MaxSubmitJobsPerUser).")
    max_queued_per_account = _count(
        "Jobs of one account in this QOS that may wait at once (MaxSubmitJobsPerAccount)."
    )
    max_wall_s = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1.0), MaxValueValidator(MAX_WALL_S)],
        help_text="The longest estimated_runtime_s (its time limit) a job of this QOS may ask for (MaxWall).",
    )
    preemptible = models.BooleanField(
        default=False,
        help_text="Jobs of a QOS that is not preemptible may preempt its jobs, whatever their"
        " priorities and on any cluster; they go first among victims.",
    )
    description = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["cluster", "-priority", "name"]
        verbose_name = "QOS"
        verbose_name_plural = "QOS"
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="one_qos_name_per_cluster")]

    def __str__(self) -> str:
        return f"{self.name} on cluster {self.cluster_id}"


class Account(models.Model):
    """A team: its fair-share weight and, optionally, the highest priority its members may request."""

    name = models.SlugField(max_length=64, unique=True)
    share = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_SHARE)],
        help_text="Weight in fair share: an account with share 3 is entitled to three times the use of one with 1.",
    )
    max_priority = models.IntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(-1_000_000), MaxValueValidator(1_000_000)],
        help_text="Highest priority its members may request (blank: their role's maximum).",
    )
    description = models.CharField(max_length=200, blank=True, default="")
    qos = models.ManyToManyField(
        Qos,
        blank=True,
        related_name="accounts",
        help_text="The QOS its jobs may use (none listed on a cluster: only normal there).",
    )
    max_queued_jobs = _count(
        "Jobs of its members that may wait at once, on every cluster together (MaxSubmitJobs of"
        " the account's association)."
    )
    default_qos = models.SlugField(
        max_length=64,
        default=DEFAULT_QOS,
        help_text="The QOS its jobs get when they name none, on each cluster where it may use it"
        " (else normal).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AccountMembership(models.Model):
    """User `user` may submit as account `account`; their jobs go to their default account unless
    they name another of theirs."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="memberships")
    is_default = models.BooleanField(
        default=False, help_text="The account the user's jobs go to when they name none (one per user)."
    )
    is_coordinator = models.BooleanField(
        default=False,
        help_text="Coordinator of the account: may cancel, hold, release, requeue and re-prioritise its"
        " jobs and choose which of its QOS each member may use.",
    )
    qos = models.ManyToManyField(
        Qos,
        blank=True,
        related_name="memberships",
        help_text="The account's QOS this member may use (none listed on a cluster: all the account's there).",
    )

    class Meta:
        ordering = ["account", "user"]
        constraints = [
            models.UniqueConstraint(fields=["user", "account"], name="one_membership_per_user_account"),
            models.UniqueConstraint(
                fields=["user"], condition=models.Q(is_default=True), name="one_default_account_per_user"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.account}"


class AccountLimit(GroupLimits):
    """An account's limits on one cluster (blank: no limit)."""

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="limits")
    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="account_limits")

    class Meta:
        ordering = ["cluster", "account"]
        constraints = [
            models.UniqueConstraint(fields=["account", "cluster"], name="one_limit_per_account_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.account} on cluster {self.cluster_id}"

"""Accounts (teams) that share clusters: their members, fair-share weights and per-cluster limits.

Imported by `models.py` (Django finds models there). One concept in the manner of Slurm's
associations: a user belongs to at most one account; an account has a share (its weight in fair
share) and, per cluster, a limit on the GPUs it holds at once and on the GPU-hours it spends in a
trailing period, and whether it may borrow idle GPUs beyond its running limit.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

MAX_SHARE = 1_000_000
MAX_PERIOD_H = 24 * 366


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

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AccountMembership(models.Model):
    """User `user` submits as account `account` (one account per user)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership")
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="memberships")

    class Meta:
        ordering = ["account", "user"]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.account}"


class AccountLimit(models.Model):
    """An account's limits on one cluster (blank: no limit)."""

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="limits")
    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="account_limits")
    max_running_gpus = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MaxValueValidator(10_000_000)],
        help_text="GPUs its jobs may hold at once on this cluster.",
    )
    gpu_hours_per_period = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1e9)],
        help_text="GPU-hours its jobs may use in the trailing period.",
    )
    period_h = models.FloatField(
        default=24.0,
        validators=[MinValueValidator(1.0), MaxValueValidator(MAX_PERIOD_H)],
        help_text="Length of the trailing period, in hours.",
    )
    may_borrow = models.BooleanField(
        default=False,
        help_text="Beyond max_running_gpus its jobs may run on idle GPUs, preempted first when others need them.",
    )

    class Meta:
        ordering = ["cluster", "account"]
        constraints = [
            models.UniqueConstraint(fields=["account", "cluster"], name="one_limit_per_account_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.account} on cluster {self.cluster_id}"

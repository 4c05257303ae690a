"""Accounts on the scheduling path: who submits as which account, the highest priority they may
request, each account's use of a cluster against its limits, and jobs' effective priorities.

The arithmetic (decayed usage, fair-share factors, the weighted sum) is `apps.placement.priority`;
this module reads the rows it needs in a few queries and hands it plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import FilteredRelation, Q
from django.utils import timezone

from apps.placement.planning import AccountQuota, ClusterSnapshot, QueuedJob
from apps.placement.priority import (
    PriorityTerms,
    PriorityWeights,
    Usage,
    decayed_gpu_seconds,
    fair_share_factors,
    priority_terms,
)
from apps.topology.models import Cluster

from . import usage as booked
from .models import Account, AccountLimit, AccountMembership, Job

LIMIT_FIELDS = ("id", "max_running_gpus", "gpu_hours_per_period", "period_h", "may_borrow")
HALF_LIVES_KEPT = 5  # usage older than this many half-lives weighs under 3% and is not read
USE_WINDOW_H = 24.0  # the Accounts table's GPU-hours of an account without a GPU-hours limit


def weights() -> PriorityWeights:
    """The effective priority's weights, from the settings."""
    return PriorityWeights(
        requested=settings.PRIORITY_WEIGHT_REQUESTED,
        age=settings.PRIORITY_WEIGHT_AGE,
        fair_share=settings.PRIORITY_WEIGHT_FAIR_SHARE,
    )


def account_of(user) -> Account | None:
    """The account `user` submits as, or None (one query, none when token authentication already
    read it with the user)."""
    try:
        membership = user.membership
    except AccountMembership.DoesNotExist:
        return None
    return membership.account


@dataclass(frozen=True, slots=True)
class QueuedCap:
    """A cap on waiting jobs: at most `value` jobs of those `jobs` selects (a filter on Job) may be
    waiting (queued or preempted) at once. `limit` names it in refusals (a setting's name, later
    a QOS's or an account's limit)."""

    limit: str
    value: int
    jobs: Q


def queued_caps(user, account: Account | None) -> list[QueuedCap]:
    """Every cap on waiting jobs that holds for `user` submitting as `account`, each checked on
    its own (the lowest binds first). Without any configuration: TOPOWEB_MAX_QUEUED_PER_USER over
    the user's jobs on every cluster. QOS and account limits add their caps here (lower ones, or
    over an account's jobs)."""
    return [QueuedCap("TOPOWEB_MAX_QUEUED_PER_USER", settings.MAX_QUEUED_PER_USER, Q(owner_id=user.pk))]


def priority_limit(user, account: Account | None, requested: int | None = None) -> int:
    """The highest priority `user` may request: their account's `max_priority` when set, else the
    users' role maximum; operators and admins may go up to theirs when that is higher. With
    `requested` within the first, the roles are not read (no query)."""
    from apps.api.roles import MANAGE_JOBS

    base = account.max_priority if account is not None and account.max_priority is not None else None
    base = settings.MAX_PRIORITY_USER if base is None else base
    if requested is not None and requested <= base:
        return base
    if user.is_superuser or user.has_perm(MANAGE_JOBS):
        return max(base, settings.MAX_PRIORITY_OPERATOR)
    return base


def _usage(cluster: Cluster, since: datetime) -> list[booked.Held]:
    """Each job generation's GPUs held on `cluster` by jobs with an account since `since`, keyed
    by account id (one query; `apps.scheduling.usage`, the usage page's source too)."""
    return booked.held(
        jobs=Q(job__cluster=cluster, job__account__isnull=False),
        since=since,
        until=None,
        key="job__account_id",
    )


@dataclass(frozen=True, slots=True)
class ClusterAccounts:
    """Every account's standing on one cluster: shares, fair-share factors, limits and use."""

    accounts: dict[int, Account]
    factors: dict[int, float]
    quotas: dict[int, AccountQuota]
    limits: dict[int, AccountLimit]
    held_gpus: dict[int, int]
    now: datetime
    usage: list[booked.Held]

    def used_s(self, account: int, period_h: float) -> float:
        """GPU-seconds `account` used in the last `period_h` hours (undecayed; the usage page's
        figure for the same period, account and cluster)."""
        since = self.now - timedelta(hours=period_h)
        return booked.gpu_seconds(
            [u for u in self.usage if u.key == account], since=since, until=self.now
        ).get(account, 0.0)


def cluster_accounts(*, cluster: Cluster, now: datetime | None = None) -> ClusterAccounts | None:
    """Read the accounts' standing on `cluster` (3 queries; 1 and None when there are no accounts)."""
    now = now or timezone.now()
    accounts: dict[int, Account] = {}
    limits: dict[int, AccountLimit] = {}
    # Accounts and their limits here in one query (a left join on this cluster's limits).
    rows = Account.objects.annotate(
        here=FilteredRelation("limits", condition=Q(limits__cluster=cluster))
    ).values_list("id", "name", "share", "max_priority", *(f"here__{f}" for f in LIMIT_FIELDS))
    for pk, name, share, max_priority, lim_id, *values in rows:
        accounts[pk] = Account(pk=pk, name=name, share=share, max_priority=max_priority)
        if lim_id is not None:
            limits[pk] = AccountLimit(
                account_id=pk, cluster=cluster, **dict(zip(LIMIT_FIELDS, [lim_id, *values], strict=False))
            )
    if not accounts:
        return None
    half_life_s = settings.FAIR_SHARE_HALF_LIFE_H * 3600.0
    longest_h = max(
        [lim.period_h for lim in limits.values() if lim.gpu_hours_per_period is not None] + [USE_WINDOW_H]
    )
    since = now - timedelta(seconds=max(HALF_LIVES_KEPT * half_life_s, longest_h * 3600.0))
    usage = _usage(cluster, since)
    factors = fair_share_factors(
        decayed_gpu_seconds(
            [Usage(h.key, h.gpus, h.begin, h.end) for h in usage], now=now, half_life_s=half_life_s
        ),
        {pk: float(a.share) for pk, a in accounts.items()},
    )
    held: dict[int, int] = {}
    for u in usage:
        if u.end is None:
            held[u.key] = held.get(u.key, 0) + u.gpus
    quotas = {}
    for pk, lim in limits.items():
        quotas[pk] = AccountQuota(
            account_id=pk,
            name=accounts[pk].name,
            max_running_gpus=lim.max_running_gpus,
            gpu_hours=lim.gpu_hours_per_period,
            period_h=lim.period_h,
            used_gpu_hours=0.0,
            may_borrow=lim.may_borrow,
        )
    standing = ClusterAccounts(accounts, factors, quotas, limits, held, now, usage)
    for pk, quota in quotas.items():
        if quota.gpu_hours is not None:
            quotas[pk] = replace(quota, used_gpu_hours=standing.used_s(pk, quota.period_h) / 3600.0)
    return standing


def rank_jobs(
    *, cluster: Cluster, snapshot: ClusterSnapshot, queue: list[QueuedJob], now: datetime
) -> dict[int, AccountQuota]:
    """Give the snapshot's active jobs and the queue their effective priorities (in place), order
    the queue by it (then age), and return the accounts' quotas on the cluster."""
    standing = cluster_accounts(cluster=cluster, now=now)
    factors = standing.factors if standing else {}
    w = weights()

    def eff(requested: int, submitted_at: datetime | None, account: int | None) -> float:
        return priority_terms(
            requested=requested,
            submitted_at=submitted_at or now,
            now=now,
            fair_share_factor=factors.get(account) if account is not None else None,
            weights=w,
        ).effective

    if cluster.preemption_enabled or (standing is not None and standing.quotas):
        # Running jobs' priorities only choose preemption and reclaim victims: without either
        # (the default), re-ranking every running job would cost each cycle for nothing.
        snapshot.active = [
            replace(a, effective=eff(a.priority, a.submitted_at, a.account)) for a in snapshot.active
        ]
    queue[:] = [replace(q, effective=eff(q.priority, q.submitted_at, q.account)) for q in queue]
    queue.sort(key=lambda q: (-q.rank, q.submitted_at, q.job_id))
    return standing.quotas if standing else {}


def job_priority(*, job: Job, now: datetime | None = None) -> PriorityTerms:
    """The terms of `job`'s effective priority now (see `apps.placement.priority`)."""
    now = now or timezone.now()
    factor = None
    if job.account_id is not None:
        standing = cluster_accounts(cluster=job.cluster, now=now)
        factor = standing.factors.get(job.account_id) if standing else None
    return priority_terms(
        requested=job.priority,
        submitted_at=job.submitted_at,
        now=now,
        fair_share_factor=factor,
        weights=weights(),
    )


def accounts_use(*, clusters: list[Cluster] | None = None, now: datetime | None = None) -> list[dict]:
    """Each account, its members, share, and per cluster its limits against its use now."""
    now = now or timezone.now()
    clusters = clusters if clusters is not None else list(Cluster.objects.order_by("name"))
    members: dict[int, list[str]] = {}
    for account_id, username in AccountMembership.objects.values_list(
        "account_id", "user__username"
    ).order_by("user__username"):
        members.setdefault(account_id, []).append(username)
    out: dict[int, dict] = {}
    for cluster in clusters:
        standing = cluster_accounts(cluster=cluster, now=now)
        if standing is None:
            return []
        for pk, account in standing.accounts.items():
            entry = out.setdefault(
                pk,
                {
                    "id": pk,
                    "name": account.name,
                    "share": account.share,
                    "max_priority": account.max_priority,
                    "members": members.get(pk, []),
                    "clusters": [],
                },
            )
            lim = standing.limits.get(pk)
            limited = lim is not None and lim.gpu_hours_per_period is not None
            window_h = lim.period_h if limited else USE_WINDOW_H
            entry["clusters"].append(
                {
                    "cluster": cluster.name,
                    "running_gpus": standing.held_gpus.get(pk, 0),
                    "max_running_gpus": lim.max_running_gpus if lim else None,
                    "gpu_hours_used": standing.used_s(pk, window_h) / 3600.0,
                    "used_since": now - timedelta(hours=window_h),
                    "used_until": now,
                    "gpu_hours_per_period": lim.gpu_hours_per_period if lim else None,
                    "period_h": window_h,
                    "may_borrow": lim.may_borrow if lim else False,
                    "fair_share_factor": round(standing.factors.get(pk, 0.0), 4),
                }
            )
    return sorted(out.values(), key=lambda e: e["name"])

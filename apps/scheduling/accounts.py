"""Accounts on the scheduling path: who submits as which account, the highest priority they may
request, each account's use of a cluster against its limits, and jobs' effective priorities.

The arithmetic (decayed usage, fair-share factors, the weighted sum) is `apps.placement.priority`;
this module reads the rows it needs in a few queries and hands it plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, FilteredRelation, Max, Min, Q
from django.utils import timezone

from apps.placement.planning import AccountQuota, ClusterSnapshot, QueuedJob
from apps.placement.priority import (
    PriorityTerms,
    PriorityWeights,
    Usage,
    decayed_gpu_seconds,
    fair_share_factors,
    gpu_seconds_since,
    priority_terms,
)
from apps.topology.models import Cluster

from .models import Account, AccountLimit, AccountMembership, Allocation, Job

LIMIT_FIELDS = ("id", "max_running_gpus", "gpu_hours_per_period", "period_h", "may_borrow")
HALF_LIVES_KEPT = 5  # usage older than this many half-lives weighs under 3% and is not read


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


def _usage(cluster: Cluster, since: datetime) -> list[Usage]:
    """Each job generation's GPUs held on `cluster` by jobs with an account, since `since` (one query)."""
    rows = (
        Allocation.objects.filter(job__cluster=cluster, job__account__isnull=False)
        .filter(Q(released_at__isnull=True) | Q(released_at__gte=since))
        .values("job__account_id", "job_id", "generation")
        .annotate(
            gpus=Count("id"),
            begin=Min("created_at"),
            end=Max("released_at"),
            open=Count("id", filter=Q(released_at__isnull=True)),
        )
        .order_by()
    )
    return [Usage(r["job__account_id"], r["gpus"], r["begin"], None if r["open"] else r["end"]) for r in rows]


@dataclass(frozen=True, slots=True)
class ClusterAccounts:
    """Every account's standing on one cluster: shares, fair-share factors, limits and use."""

    accounts: dict[int, Account]
    factors: dict[int, float]
    quotas: dict[int, AccountQuota]
    limits: dict[int, AccountLimit]
    held_gpus: dict[int, int]
    now: datetime


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
    longest_h = max([lim.period_h for lim in limits.values() if lim.gpu_hours_per_period is not None] or [0])
    since = now - timedelta(seconds=max(HALF_LIVES_KEPT * half_life_s, longest_h * 3600.0))
    usage = _usage(cluster, since)
    factors = fair_share_factors(
        decayed_gpu_seconds(usage, now=now, half_life_s=half_life_s),
        {pk: float(a.share) for pk, a in accounts.items()},
    )
    held: dict[int, int] = {}
    for u in usage:
        if u.end is None:
            held[u.account] = held.get(u.account, 0) + u.gpus
    quotas = {}
    for pk, lim in limits.items():
        used_s = 0.0
        if lim.gpu_hours_per_period is not None:
            since_period = now - timedelta(hours=lim.period_h)
            used_s = gpu_seconds_since(
                [u for u in usage if u.account == pk], since=since_period, now=now
            ).get(pk, 0.0)
        quotas[pk] = AccountQuota(
            account_id=pk,
            name=accounts[pk].name,
            max_running_gpus=lim.max_running_gpus,
            gpu_hours=lim.gpu_hours_per_period,
            period_h=lim.period_h,
            used_gpu_hours=used_s / 3600.0,
            may_borrow=lim.may_borrow,
        )
    return ClusterAccounts(accounts, factors, quotas, limits, held, now)


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


def accounts_use(*, clusters: list[Cluster] | None = None) -> list[dict]:
    """Each account, its members, share, and per cluster its limits against its use now."""
    now = timezone.now()
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
            quota = standing.quotas.get(pk)
            entry["clusters"].append(
                {
                    "cluster": cluster.name,
                    "running_gpus": standing.held_gpus.get(pk, 0),
                    "max_running_gpus": lim.max_running_gpus if lim else None,
                    "gpu_hours_used": round(quota.used_gpu_hours, 3)
                    if quota and lim.gpu_hours_per_period
                    else None,
                    "gpu_hours_per_period": lim.gpu_hours_per_period if lim else None,
                    "period_h": lim.period_h if lim else None,
                    "may_borrow": lim.may_borrow if lim else False,
                    "fair_share_factor": round(standing.factors.get(pk, 0.0), 4),
                }
            )
    return sorted(out.values(), key=lambda e: e["name"])

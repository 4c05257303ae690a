"""Accounts on the scheduling path: who submits as which account and QOS, the highest priority
they may request, the caps on their waiting jobs, each account's and QOS's use of a cluster
against its limits, and jobs' effective priorities.

The arithmetic (decayed usage, fair-share factors, the weighted sum) is `apps.placement.priority`;
this module reads the rows it needs in a few queries and hands it plain data.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, FilteredRelation, OuterRef, Q
from django.utils import timezone

from apps.placement.planning import AccountQuota, ClusterSnapshot, QosLimits, QueuedJob
from apps.placement.priority import (
    PriorityTerms,
    PriorityWeights,
    Usage,
    decayed_gpu_seconds,
    fair_share_factors,
    no_account_factor,
    priority_terms,
)
from apps.placement.topology import SpecError
from apps.topology.models import Cluster

from . import recent as recent_reads
from . import usage as booked
from .account_models import DEFAULT_QOS
from .models import Account, AccountLimit, AccountMembership, Job, Qos

LIMIT_FIELDS = (
    "id",
    "max_running_gpus",
    "max_running_jobs",
    "gpu_hours_per_period",
    "period_h",
    "may_borrow",
)
HALF_LIVES_KEPT = 5  # usage older than this many half-lives weighs under 3% and is not read
USE_WINDOW_H = 24.0  # the Accounts table's GPU-hours of an account without a GPU-hours limit


def weights() -> PriorityWeights:
    """The effective priority's weights, from the settings."""
    return PriorityWeights(
        requested=settings.PRIORITY_WEIGHT_REQUESTED,
        age=settings.PRIORITY_WEIGHT_AGE,
        fair_share=settings.PRIORITY_WEIGHT_FAIR_SHARE,
        qos=settings.PRIORITY_WEIGHT_QOS,
    )


def account_of(user, name: str | None = None, *, recent: bool = False) -> Account | None:
    """The account `user` submits as: the one named (`name`, one of theirs), else their default
    (one query; `recent`: none when this process read it within `recent.RECENT_S`). None for a
    user in no account, unless TOPOWEB_REQUIRE_ACCOUNT refuses them. Raises SpecError on `account`."""
    if recent:
        return recent_reads.read(("account", user.pk, name), lambda: account_of(user, name))
    rows = AccountMembership.objects.filter(user_id=user.pk).select_related("account")
    if name is not None:
        found = rows.filter(account__name=name).first()
        if found is None:
            raise SpecError([("account", f"you are not a member of an account named {name!r}")])
        return found.account
    # Their default, else (none marked) the first by name: one query.
    found = rows.order_by("-is_default", "account__name").first()
    if found is None and settings.REQUIRE_ACCOUNT:
        raise SpecError(
            [
                (
                    "account",
                    "you are in no account and this site requires one (TOPOWEB_REQUIRE_ACCOUNT): ask an operator to add you to one",
                )
            ]
        )
    return found.account if found is not None else None


def qos_for(
    *, cluster: Cluster, account: Account | None, name: str | None, user=None, recent: bool = False
) -> Qos:
    """The QOS a job of `account` on `cluster` runs in: the one named, else the account's default
    (when it may use it there), else `normal`. An account may use the QOS it lists on the cluster,
    or only `normal` when it lists none there; a user in no account, only `normal`. A member
    (`user`) whose membership lists QOS of the cluster (set by the account's coordinators) may
    use only those of the account's. One query (`recent`: none when this process read the same
    within `recent.RECENT_S`). Raises SpecError on `qos` (a QOS the account or member may not use,
    or that does not exist)."""
    if recent:
        key = (
            "qos",
            cluster.pk,
            account.pk if account is not None else None,
            name,
            getattr(user, "pk", None),
        )
        return recent_reads.read(key, lambda: qos_for(cluster=cluster, account=account, name=name, user=user))
    listed: list[Qos] = []
    if account is not None and account.pk:
        rows = account.qos.filter(cluster=cluster)
        if user is not None:
            mine = AccountMembership.qos.through.objects.filter(
                accountmembership__user_id=user.pk,
                accountmembership__account_id=account.pk,
                qos__cluster=cluster,
            )
            rows = rows.annotate(member_may=Exists(mine.filter(qos_id=OuterRef("pk"))), limited=Exists(mine))
        listed = list(rows)
        lists_any = bool(listed)
        listed = [q for q in listed if user is None or not q.limited or q.member_may]
    else:
        lists_any = False
    if not lists_any:
        listed = [Qos.objects.get_or_create(cluster=cluster, name=DEFAULT_QOS)[0]]
    by_name = {q.name: q for q in listed}
    wanted = name
    if wanted is None:
        default = account.default_qos if account is not None else DEFAULT_QOS
        wanted = default if default in by_name else DEFAULT_QOS
    if wanted in by_name:
        return by_name[wanted]
    whose = (
        f"account {account.name}" + (f" (for {user.get_username()})" if user is not None else "")
        if account is not None
        else "a user in no account"
    )
    if name is None:
        raise SpecError(
            [
                (
                    "qos",
                    f"{whose} has no default QOS on cluster {cluster.name!r}; name one of: {', '.join(sorted(by_name))}",
                )
            ]
        )
    raise SpecError(
        [
            (
                "qos",
                f"{whose} may not use QOS {name!r} on cluster {cluster.name!r}; it may use: {', '.join(sorted(by_name))}",
            )
        ]
    )


def time_limit_s(runtime_s: float | None, time_limit_min: int | None) -> float | None:
    """A job's time limit in seconds: its `time_limit_min` when set (the limit the agents and
    Slurm enforce), else its `estimated_runtime_s`; None without either."""
    return time_limit_min * 60.0 if time_limit_min is not None else runtime_s


def check_qos_job(qos: Qos, *, gpus: int, runtime_s: float | None, time_limit_min: int | None = None) -> None:
    """Refuse (SpecError) a job that its QOS's per-job limits could never let start."""
    errors = []
    if qos.max_gpus_per_job is not None and gpus > qos.max_gpus_per_job:
        errors.append(
            (
                "gpus",
                f"QOS {qos.name} allows at most {qos.max_gpus_per_job} GPUs per job, this job asks for {gpus}",
            )
        )
    limit_s = time_limit_s(runtime_s, time_limit_min)
    if qos.max_wall_s is not None and (limit_s is None or limit_s > qos.max_wall_s):
        field = "time_limit_min" if time_limit_min is not None else "estimated_runtime_s"
        asks = "none" if limit_s is None else f"{limit_s:g} s"
        errors.append(
            (
                field,
                f"QOS {qos.name} allows jobs of at most {qos.max_wall_s:g} s (its time limit:"
                f" time_limit_min, else estimated_runtime_s); this job asks for {asks}",
            )
        )
    if errors:
        raise SpecError(errors)


@dataclass(frozen=True, slots=True)
class QueuedCap:
    """A cap on waiting jobs: at most `value` jobs of those `jobs` selects (a filter on Job) may be
    waiting (queued or preempted) at once. `limit` names it in refusals (a setting's name or a
    QOS's limit); `qos_id` and `account_id` (None: any) say which new jobs it counts."""

    limit: str
    value: int
    jobs: Q
    qos_id: int | None = None
    account_id: int | None = None

    def matches(self, job: Job) -> bool:
        """Whether queuing `job` counts against this cap."""
        return (self.qos_id is None or job.qos_id == self.qos_id) and (
            self.account_id is None or job.account_id == self.account_id
        )


def queued_caps(user, qos: Iterable[tuple[Account | None, Qos]] = ()) -> list[QueuedCap]:
    """Every cap on waiting jobs that holds for `user` submitting into the (account, QOS) pairs
    `qos`, each checked on its own. Without any configuration: TOPOWEB_MAX_QUEUED_PER_USER over
    the user's jobs on every cluster; an account's `max_queued_jobs` its members' jobs on every
    cluster (MaxSubmitJobs of the account); each QOS adds its caps on the user's jobs in it and
    on its account's (MaxSubmitJobsPerUser/Account), the lowest binding first."""
    caps = [QueuedCap("TOPOWEB_MAX_QUEUED_PER_USER", settings.MAX_QUEUED_PER_USER, Q(owner_id=user.pk))]
    seen: set[tuple] = set()
    for acct, q in qos:
        if acct is not None and acct.max_queued_jobs is not None and ("acct", acct.pk) not in seen:
            seen.add(("acct", acct.pk))
            caps.append(
                QueuedCap(
                    f"account {acct.name}: queued jobs",
                    acct.max_queued_jobs,
                    Q(account_id=acct.pk),
                    account_id=acct.pk,
                )
            )
        if q.max_queued_per_user is not None and ("user", q.pk) not in seen:
            seen.add(("user", q.pk))
            caps.append(
                QueuedCap(
                    f"QOS {q.name}: queued jobs per user",
                    q.max_queued_per_user,
                    Q(owner_id=user.pk, qos_id=q.pk),
                    qos_id=q.pk,
                )
            )
        if (
            q.max_queued_per_account is not None
            and acct is not None
            and ("account", q.pk, acct.pk) not in seen
        ):
            seen.add(("account", q.pk, acct.pk))
            caps.append(
                QueuedCap(
                    f"QOS {q.name}: queued jobs per account ({acct.name})",
                    q.max_queued_per_account,
                    Q(account_id=acct.pk, qos_id=q.pk),
                    qos_id=q.pk,
                    account_id=acct.pk,
                )
            )
    return caps


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


def _usage(cluster: Cluster, since: datetime, by: str = "account") -> list[booked.Held]:
    """Each job generation's GPUs held on `cluster` since `since` by jobs with an account (`by`
    "account") or a QOS (`by` "qos"), keyed by that id (one query; `apps.scheduling.usage`, the
    usage page's source too)."""
    return booked.held(
        jobs=Q(job__cluster=cluster, **{f"job__{by}__isnull": False}),
        since=since,
        until=None,
        key=f"job__{by}_id",
    )


QOS_LIMIT_FIELDS = (
    "max_gpus_per_job",
    "max_wall_s",
    "max_running_gpus",
    "max_running_jobs",
    "max_running_gpus_per_user",
    "max_running_jobs_per_user",
    "max_running_gpus_per_account",
    "max_running_jobs_per_account",
    "may_borrow",
    "preemptible",
    "period_h",
)


def cluster_qos(*, cluster: Cluster, now: datetime) -> dict[int, QosLimits]:
    """Every QOS of `cluster` with its limits and, for those with a GPU-hour budget, the use made
    in its period (1 query, 2 with a budget)."""
    rows = list(Qos.objects.filter(cluster=cluster))
    budgets = [q for q in rows if q.gpu_hours_per_period is not None]
    used: dict[int, float] = {}
    if budgets:
        since = now - timedelta(hours=max(q.period_h for q in budgets))
        usage = _usage(cluster, since, by="qos")
        for q in budgets:
            period_since = now - timedelta(hours=q.period_h)
            mine = [u for u in usage if u.key == q.pk]
            used[q.pk] = booked.gpu_seconds(mine, since=period_since, until=now).get(q.pk, 0.0) / 3600.0
    return {
        q.pk: QosLimits(
            qos_id=q.pk,
            name=q.name,
            priority=q.priority,
            gpu_hours=q.gpu_hours_per_period,
            used_gpu_hours=used.get(q.pk, 0.0),
            **{f: getattr(q, f) for f in QOS_LIMIT_FIELDS},
        )
        for q in rows
    }


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
            max_running_jobs=lim.max_running_jobs,
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
) -> tuple[dict[int, AccountQuota], dict[int, QosLimits]]:
    """Give the snapshot's active jobs and the queue their effective priorities (in place), order
    the queue by it (then age), and return the accounts' quotas and the QOS's limits on the cluster."""
    standing = cluster_accounts(cluster=cluster, now=now)
    factors = standing.factors if standing else {}
    no_account = no_account_factor(factors)
    qos = cluster_qos(cluster=cluster, now=now)
    w = weights()

    def eff(requested: int, submitted_at: datetime | None, account: int | None, q: int | None) -> float:
        return priority_terms(
            requested=requested,
            submitted_at=submitted_at or now,
            now=now,
            fair_share_factor=factors.get(account, no_account) if account is not None else no_account,
            weights=w,
            qos_priority=qos[q].priority if q in qos else 0,
        ).effective

    if (
        cluster.preemption_enabled
        or (standing is not None and standing.quotas)
        or any(q.preemptible for q in qos.values())
    ):
        # Running jobs' priorities only choose preemption and reclaim victims: without either
        # (the default), re-ranking every running job would cost each cycle for nothing.
        snapshot.active = [
            replace(a, effective=eff(a.priority, a.submitted_at, a.account, a.qos)) for a in snapshot.active
        ]
    queue[:] = [replace(q, effective=eff(q.priority, q.submitted_at, q.account, q.qos)) for q in queue]
    queue.sort(key=lambda q: (-q.rank, q.submitted_at, q.job_id))
    return (standing.quotas if standing else {}), qos


def job_priority(*, job: Job, now: datetime | None = None) -> PriorityTerms:
    """The terms of `job`'s effective priority now (see `apps.placement.priority`)."""
    now = now or timezone.now()
    standing = cluster_accounts(cluster=job.cluster, now=now)
    factors = standing.factors if standing else {}
    no_account = no_account_factor(factors)
    factor = factors.get(job.account_id, no_account) if job.account_id is not None else no_account
    return priority_terms(
        requested=job.priority,
        submitted_at=job.submitted_at,
        now=now,
        fair_share_factor=factor,
        weights=weights(),
        qos_priority=job.qos.priority if job.qos_id is not None else 0,
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
                    "max_running_jobs": lim.max_running_jobs if lim else None,
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

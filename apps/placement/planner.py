"""One scheduling cycle planned over plain data: gang placement, EASY backfill and preemption.

No database here: the cycle service hands in a `ClusterSnapshot` and the queue, and commits the
returned `CyclePlan` in one transaction.

EASY backfill: the first job that cannot be placed (the head) gets a reservation: the earliest
time T at which it is expected to fit, and the GPUs it is reserved then. The active jobs' expected
ends (start, or placement, plus estimated_runtime_s) release their GPUs in order; T is the first
release after which `PROBE_POLICY` places the head on the GPUs free by then (the first release
with enough GPUs, else bisection over the later ones), and that placement's GPUs are reserved. A
lower-priority job may start before the head only if it has an estimated runtime and either ends
by T (it may use any free GPU), or fits on the free GPUs outside the reserved ones: no backfilled
job can make the head's shape miss T, whatever GPUs the count leaves. A running job with no
estimate has no expected end; if the head needs its GPUs, T is unknown and nothing is backfilled.

Preemption takes the fewest lower-priority active jobs. A victim whose ranks run under node
agents frees its GPUs only once they exited, so it is preempted in two phases: this cycle it is
told to stop and its preemptor waits, holding the GPUs it will use (the victim's, still busy,
plus free ones) against every job behind it; a later cycle, when the snapshot shows them free,
books it. Meanwhile GPUs still stopping count for it, so it never takes a second victim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from .costmodel import evaluate
from .planning import AccountQuota, ActiveJob, ClusterSnapshot, QosLimits, QueuedJob, time_limit_s
from .solvers import NoFit, Placement, place
from .solvers.base import shortage
from .topology import shorten


@dataclass(slots=True)
class Booking:
    """A queued job to place on `placement.gids`."""

    job: QueuedJob
    placement: Placement
    # Placed beyond its account's running-GPU limit, on idle GPUs: reclaimed first.
    borrowed: bool = False


@dataclass(slots=True)
class Eviction:
    """An active job to preempt so that job `by_job` (priority `by_priority`) can start. A victim
    whose ranks run under agents is `stopping`: its GPUs stay allocated until every rank exited,
    and `by_job` is placed by a later cycle, not this one."""

    victim: ActiveJob
    by_job: int
    by_priority: int
    stopping: bool = False
    # The preemptor's account, when the victim ran on capacity borrowed from it (a reclaim).
    reclaimed_for: str = ""
    # Why, when the victim was taken for its preemptible QOS (else "": by priority or reclaim).
    why: str = ""


@dataclass(slots=True)
class CyclePlan:
    """What one cycle decided: bookings, evictions, why each other waiting job waits, and the
    jobs that could not be evaluated (failed)."""

    bookings: list[Booking] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)
    overdue: dict[int, bool] = field(default_factory=dict)
    # Jobs whose evaluation raised, with the error: the cycle marks them failed.
    failed: dict[int, str] = field(default_factory=dict)


@dataclass(slots=True)
class Reservation:
    """The head job's reserved start `start` (None if unknown) and the GPUs it is reserved then
    (`gids`, a bool mask over gids; None when the start is unknown)."""

    job_id: int
    priority: int
    start: datetime | None
    gids: np.ndarray | None = field(default=None, repr=False, compare=False)
    _text: str = field(default="", init=False, repr=False, compare=False)

    def text(self) -> str:
        # Built once: every job waiting behind the head quotes it.
        if not self._text:
            self._text = self._compose()
        return self._text

    def _compose(self) -> str:
        if self.start is None:
            return (
                f"waiting behind job {self.job_id} (priority {self.priority}), whose start time is unknown"
                " because the jobs it waits for have no estimated_runtime_s"
            )
        return f"waiting behind job {self.job_id} (priority {self.priority}) reserved to start at {_iso(self.start)}"


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_cycle(
    snapshot: ClusterSnapshot,
    queue: list[QueuedJob],
    *,
    cluster_policy: str,
    backfill: bool,
    preemption: bool,
    now: datetime,
    quotas: Mapping[int, AccountQuota] | None = None,
    qos: Mapping[int, QosLimits] | None = None,
) -> CyclePlan:
    """Walk `queue` (already by effective priority, then age) and decide every job's fate this cycle.

    `quotas` (by account id): a job whose account spent its GPU-hours waits; one that would take
    its account past its running-GPU limit waits, or, when the account may borrow, is placed on
    idle GPUs only (never preempting, never reserving) as borrowed capacity. A job within its
    account's limits may reclaim borrowed capacity: other accounts' borrowed jobs are preempted
    for it whatever their priority, even where preemption is off; they are always the first victims.

    `qos` (by QOS id): a job over one of its QOS's limits waits, saying which (or borrows idle
    GPUs, when its QOS may and the limit is a running one); a job of a QOS that is not preemptible
    may preempt jobs of preemptible QOS, whatever their priority, even where preemption is off.
    A GPU-hour budget (account's or QOS's) is charged ahead: a job with an estimated runtime
    starts only if its GPUs x runtime fit in what is left once the use made and the running jobs'
    remaining estimated runtimes are counted (Slurm's `safe` enforcement).
    """
    limits = _Limits(quotas or {}, qos or {}, now)
    for a in snapshot.active:
        limits.hold(a.account, a.owner, a.qos, len(a.gids), a.charged_until)
    topo = snapshot.topology
    free = snapshot.free.copy()
    load = dict(snapshot.link_load)
    plan = CyclePlan(overdue=overdue_flags(snapshot.active, now))
    # Jobs that hold or will hold GPUs after this cycle, for the reservation's release times.
    holders: dict[int, _Holder] = {
        a.job_id: _Holder(a.gids, a.expected_end, a.flows) for a in snapshot.active
    }
    evicted: set[int] = set()
    # GPUs that free up once their ranks exited, not yet held for a preemptor this cycle.
    stopping = np.zeros_like(free) if snapshot.stopping is None else snapshot.stopping.copy()
    # Shapes that did not fit on all free GPUs (False) or on those outside the reservation (True).
    no_fit: dict[tuple, NoFit] = {}
    reservation: Reservation | None = None
    for job in queue:
        # One job's evaluation must not stop the cycle for the others: everything that may raise
        # (solvers, cost model, dates) runs before this job changes the plan's free GPUs or loads.
        try:
            spec = job.spec
            policy = job.policy or cluster_policy
            quota = limits.quotas.get(job.account) if job.account is not None else None
            limit_s = time_limit_s(spec)
            over, borrowing = limits.why(job, spec.gpus, limit_s)
            if over and not borrowing:
                plan.waiting[job.job_id] = over
                continue
            if reservation is not None and not backfill:
                plan.waiting[job.job_id] = f"{reservation.text()}; backfill is off on this cluster"
                continue
            outside = False
            if reservation is not None:
                # Decided before placing: a job that may not jump the head costs no solver time.
                blocked, outside = _backfill_blocked(reservation, job, now)
                if blocked:
                    plan.waiting[job.job_id] = blocked
                    continue
            shape = (policy, spec.gpus, spec.tp, spec.cp, spec.pp, spec.dp, spec.ep, spec.rank_order, outside)
            # Too few GPUs free: every solver says so first; asking it costs more in a long queue.
            result = shortage(spec, free)
            usable = free
            if result is None and outside:
                usable = free & ~reservation.gids
                result = shortage(spec, usable)
            if result is None and shape in no_fit:
                # Free GPUs only shrink during the walk: a shape that did not fit still does not.
                result = no_fit[shape]
            elif result is None:
                result = place(topo, usable, load, spec, policy=policy)
            if isinstance(result, NoFit):
                no_fit[shape] = result
            if isinstance(result, Placement):
                _take(free, load, result)
                plan.bookings.append(Booking(job, result, borrowing))
                limits.hold(job.account, job.owner, job.qos, spec.gpus, _end(now, limit_s))
                holders[job.job_id] = _Holder(
                    result.gids, _end(now, spec.estimated_runtime_s), result.prediction.flows
                )
                continue
            if borrowing:
                # Borrowed capacity is idle capacity: a borrower neither preempts nor reserves.
                plan.waiting[job.job_id] = (
                    f"{over}; it may borrow idle GPUs, but does not fit on them: {result.reason}"
                )
                continue
            if outside:
                plan.waiting[job.job_id] = (
                    f"{reservation.text()}; it would run {spec.estimated_runtime_s:.0f} s, past that"
                    f" start, and does not fit outside the {int(np.count_nonzero(reservation.gids))}"
                    f" GPUs reserved for it: {result.reason}"
                )
                continue
            reclaim = quota is not None
            over_preemptible = not limits.preemptible(job.qos) and any(
                limits.preemptible(a.qos) for a in snapshot.active
            )
            if reservation is None and (preemption or reclaim or over_preemptible):
                victims, placed = _preempt_for(
                    snapshot,
                    job,
                    policy,
                    free | stopping,
                    load,
                    evicted,
                    alone=bool(stopping.any()),
                    by_priority=preemption,
                    reclaim=reclaim,
                    preemptible=limits.preemptible if over_preemptible else None,
                )
                if placed is not None:
                    no_fit.clear()
                    gids = list(placed.gids)
                    # Two phases when it needs GPUs whose processes have yet to exit.
                    waits = bool(stopping[gids].any()) or any(v.launched for v in victims)
                    for victim in victims:
                        evicted.add(victim.job_id)
                        holders.pop(victim.job_id, None)
                        free[list(victim.gids)] = not victim.launched
                        stopping[list(victim.gids)] = victim.launched
                        _subtract(load, victim.flows)
                        limits.hold(
                            victim.account, victim.owner, victim.qos, -len(victim.gids), victim.charged_until
                        )
                        lender = quota.name if reclaim and victim.borrowed else ""
                        why = ""
                        if not lender and over_preemptible and limits.preemptible(victim.qos):
                            why = (
                                f"preempted by job {job.job_id} of QOS {limits.name(job.qos)}:"
                                f" QOS {limits.name(victim.qos)} may be preempted by others"
                            )
                        plan.evictions.append(
                            Eviction(victim, job.job_id, job.priority, victim.launched, lender, why)
                        )
                    limits.hold(job.account, job.owner, job.qos, spec.gpus, _end(now, limit_s))
                    if waits:
                        # Held for it: no job behind it takes these GPUs while the ranks stop.
                        free[gids] = False
                        stopping[gids] = False
                        holders[job.job_id] = _Holder(
                            placed.gids, _end(now, spec.estimated_runtime_s), placed.prediction.flows
                        )
                        plan.waiting[job.job_id] = _stopping_text(victims)
                        continue
                    _take(free, load, placed)
                    plan.bookings.append(Booking(job, placed))
                    holders[job.job_id] = _Holder(
                        placed.gids, _end(now, spec.estimated_runtime_s), placed.prediction.flows
                    )
                    continue
            if reservation is None:
                reservation, why = _reserve(topo, job, policy, free, load, holders, now)
                plan.waiting[job.job_id] = f"{result.reason}; {why}"
            else:
                plan.waiting[job.job_id] = result.reason
        except Exception as exc:
            plan.failed[job.job_id] = shorten(f"{type(exc).__name__}: {exc}", 500)
    return plan


class _Limits:
    """The accounts' and QOS's limits and what the active and just-booked jobs hold against them
    during one cycle's walk: GPUs and jobs per account, per (QOS, user), per (QOS, account), and
    the GPU-hours they are charged ahead (GPUs x remaining estimated runtime)."""

    def __init__(self, quotas: Mapping[int, AccountQuota], qos: Mapping[int, QosLimits], now: datetime):
        self.quotas, self.qos, self.now = quotas, qos, now
        self.held: dict[int, int] = {}
        self.use: dict[tuple, list[float]] = {}  # key -> [gpus, jobs, GPU-hours ahead]

    def preemptible(self, qos: int | None) -> bool:
        limits = self.qos.get(qos) if qos is not None else None
        return limits is not None and limits.preemptible

    def name(self, qos: int | None) -> str:
        limits = self.qos.get(qos) if qos is not None else None
        return limits.name if limits is not None else "(none)"

    def _keys(self, account: int | None, owner: int | None, qos: int | None) -> list[tuple]:
        keys: list[tuple] = []
        if account is not None:
            keys.append(("account", account))
        if qos is not None:
            keys.append(("qos", qos))
            if owner is not None:
                keys.append(("user", qos, owner))
            if account is not None:
                keys.append(("qos-account", qos, account))
        return keys

    def hold(
        self, account: int | None, owner: int | None, qos: int | None, gpus: int, end: datetime | None
    ) -> None:
        """Count `gpus` GPUs (negative: given back) held until `end` (None: unknown)."""
        if account is not None:
            self.held[account] = self.held.get(account, 0) + gpus
        ahead_h = gpus * max((end - self.now).total_seconds(), 0.0) / 3600.0 if end is not None else 0.0
        sign = 1 if gpus >= 0 else -1
        for key in self._keys(account, owner, qos):
            use = self.use.setdefault(key, [0, 0, 0.0])
            use[0] += gpus
            use[1] += sign
            use[2] += ahead_h

    def _get(self, *key) -> list[float]:
        return self.use.get(key, [0, 0, 0.0])

    def why(self, job: QueuedJob, gpus: int, runtime_s: float | None) -> tuple[str, bool]:
        """Why `job` (`gpus` GPUs for `runtime_s`, its time limit) is over a limit of its account's or QOS's ("" if
        it is not), and whether it may still run on borrowed capacity: only when every limit it
        is over is a running limit of an account or QOS that may borrow."""
        borrowable = ""
        need_h = gpus * runtime_s / 3600.0 if runtime_s is not None else 0.0
        quota = self.quotas.get(job.account) if job.account is not None else None
        if quota is not None:
            if quota.gpu_hours is not None:
                ahead = self._get("account", quota.account_id)[2]
                why = _budget(
                    f"account {quota.name}",
                    quota.gpu_hours,
                    quota.period_h,
                    quota.used_gpu_hours,
                    ahead,
                    need_h,
                )
                if why:
                    return why, False
            now_held = self.held.get(quota.account_id, 0)
            if quota.max_running_gpus is not None and now_held + gpus > quota.max_running_gpus:
                why = (
                    f"account {quota.name} holds {now_held} of its limit of {quota.max_running_gpus} running"
                    f" GPUs; this job's {gpus} would exceed it"
                )
                if not quota.may_borrow:
                    return why, False
                borrowable = why
            now_jobs = int(self._get("account", quota.account_id)[1])
            if quota.max_running_jobs is not None and now_jobs + 1 > quota.max_running_jobs:
                why = f"account {quota.name} runs {now_jobs} of its limit of {quota.max_running_jobs} running jobs"
                if not quota.may_borrow:
                    return why, False
                borrowable = borrowable or why
        q = self.qos.get(job.qos) if job.qos is not None else None
        if q is not None:
            head = f"QOS {q.name}"
            if q.max_gpus_per_job is not None and gpus > q.max_gpus_per_job:
                return f"{head}: GPUs per job {gpus} of at most {q.max_gpus_per_job}", False
            if q.max_wall_s is not None and (runtime_s is None or runtime_s > q.max_wall_s):
                asks = "no time limit" if runtime_s is None else f"a time limit of {runtime_s:g} s"
                return f"{head}: wall time per job at most {q.max_wall_s:g} s, this job has {asks}", False
            if q.gpu_hours is not None:
                why = _budget(
                    head, q.gpu_hours, q.period_h, q.used_gpu_hours, self._get("qos", q.qos_id)[2], need_h
                )
                if why:
                    return why, False
            running = [
                ("running GPUs", q.max_running_gpus, ("qos", q.qos_id), 0, gpus),
                ("running jobs", q.max_running_jobs, ("qos", q.qos_id), 1, 1),
                (
                    "running GPUs per user",
                    q.max_running_gpus_per_user,
                    ("user", q.qos_id, job.owner),
                    0,
                    gpus,
                ),
                ("running jobs per user", q.max_running_jobs_per_user, ("user", q.qos_id, job.owner), 1, 1),
                (
                    "running GPUs per account",
                    q.max_running_gpus_per_account,
                    ("qos-account", q.qos_id, job.account),
                    0,
                    gpus,
                ),
                (
                    "running jobs per account",
                    q.max_running_jobs_per_account,
                    ("qos-account", q.qos_id, job.account),
                    1,
                    1,
                ),
            ]
            for what, limit, key, slot, adding in running:
                if limit is None or key[-1] is None:
                    continue
                now = int(self._get(*key)[slot])
                if now + adding > limit:
                    why = f"{head}: {what} {now} of {limit}"
                    if slot == 0:
                        why += f"; this job's {gpus} would exceed it"
                    if not q.may_borrow:
                        return why, False
                    borrowable = borrowable or why
        return borrowable, bool(borrowable)


def _budget(who: str, budget_h: float, period_h: float, used_h: float, ahead_h: float, need_h: float) -> str:
    """Why a job needing `need_h` GPU-hours does not fit in `who`'s budget ("" if it does): the
    use made in the period plus the running jobs' remaining estimate plus its own, charged ahead."""
    if used_h >= budget_h:
        return (
            f"{who} has used {used_h:.1f} of its {budget_h:g} GPU-hours in the last {period_h:g} h;"
            " it waits until older use leaves that window"
        )
    left = budget_h - used_h - ahead_h
    if need_h > 0 and need_h > left:
        return (
            f"{who} has {max(left, 0.0):.1f} of its {budget_h:g} GPU-hours per {period_h:g} h left"
            f" ({used_h:.1f} used, {ahead_h:.1f} held by running jobs' time limits); this job's"
            f" GPUs x time limit need {need_h:.1f}, it waits until it could finish within the budget"
        )
    return ""


def overdue_flags(active: list[ActiveJob], now: datetime) -> dict[int, bool]:
    """Running jobs past twice their estimated runtime (True) or not (False), by job id."""
    flags = {}
    for a in active:
        if a.running and a.started_at is not None and a.estimated_runtime_s is not None:
            flags[a.job_id] = (now - a.started_at).total_seconds() > 2 * a.estimated_runtime_s
    return flags


def _end(now: datetime, runtime_s: float | None) -> datetime | None:
    return None if runtime_s is None else now + timedelta(seconds=runtime_s)


def _take(free: np.ndarray, load: dict[str, float], placement: Placement) -> None:
    free[list(placement.gids)] = False
    for leaf, flow in placement.prediction.flows.items():
        load[leaf] = load.get(leaf, 0.0) + float(flow)


def _subtract(load: dict[str, float], flows) -> None:
    for leaf, flow in flows.items():
        left = load.get(leaf, 0.0) - float(flow)
        # Float residue from repeated add/subtract must not read as load.
        load[leaf] = left if left > 1e-9 else 0.0


@dataclass(frozen=True, slots=True)
class _Holder:
    """GPUs held by an active or just-booked job, when they are expected free, and its flows."""

    gids: tuple[int, ...]
    end: datetime | None
    flows: object


# The policy that finds when the head fits and the GPUs reserved for it: the lowest switch that
# fits, best-fit leaves under it (a compact set), at a thirtieth of topo's cost. Its feasibility is
# every policy's (enough GPUs joined by a network or one NVLink domain); at the reserved start the
# head's own policy places it on the free GPUs, which include the reserved ones.
PROBE_POLICY = "tree_best_fit"


def _reserve(
    topo,
    job: QueuedJob,
    policy: str,
    free: np.ndarray,
    load: dict[str, float],
    holders: dict[int, _Holder],
    now: datetime,
) -> tuple[Reservation, str]:
    """The head's reservation: the first expected release after which it fits on the GPUs free
    by then, and its placement there; with the text of when it is expected to start."""
    spec = job.spec
    unknown = sorted(jid for jid, h in holders.items() if h.end is None)
    ends = sorted((h.end, jid) for jid, h in holders.items() if h.end is not None)
    # Releases at one instant are one step: step k frees the GPUs of every job ending by times[k].
    times: list[datetime] = []
    released: list[list[int]] = []
    for end, jid in ends:
        if not times or end != times[-1]:
            times.append(end)
            released.append([])
        released[-1].append(jid)
    step_of = np.full(free.size, len(times), dtype=np.int64)
    counts = np.zeros(len(times), dtype=np.int64)
    for k, jids in enumerate(released):
        for jid in jids:
            gids = list(holders[jid].gids)
            step_of[gids] = k
            counts[k] += len(gids)
    enough = np.flatnonzero(int(np.count_nonzero(free)) + np.cumsum(counts) >= spec.gpus)

    def at(k: int) -> tuple[np.ndarray, dict[str, float]]:
        trial_load = dict(load)
        for jids in released[: k + 1]:
            for jid in jids:
                _subtract(trial_load, holders[jid].flows)
        return free | (step_of <= k), trial_load

    def fits(k: int, how: str) -> Placement | None:
        result = place(topo, *at(k), spec, policy=how)
        return result if isinstance(result, Placement) else None

    # Placing only grows easier as GPUs are released: the first step with enough GPUs usually
    # fits (always on a network), else bisect between it and the last.
    how, found, lo = PROBE_POLICY, None, 0
    if enough.size:
        lo, last = int(enough[0]), len(times) - 1
        found = fits(lo, how)
        if found is None:
            first = lo + 1
            found = fits(last, how) if lo < last else None
            if found is None and policy != how:
                # A shape only the head's own policy finds: it probes from here.
                how, found, first = policy, fits(last, policy), lo
            if found is not None:
                lo, hi = first, last
                while lo < hi:
                    mid = (lo + hi) // 2
                    placed = fits(mid, how)
                    if placed is None:
                        lo = mid + 1
                    else:
                        hi, found = mid, placed
    if found is None:
        res = Reservation(job.job_id, job.priority, None)
        if unknown:
            names = _id_list(unknown)
            return res, f"start time unknown: it needs GPUs of jobs without estimated_runtime_s ({names})"
        return res, "start time unknown: it does not fit even once every running job has ended"
    start = max(times[lo], now)
    mask = np.zeros(free.size, dtype=bool)
    mask[list(found.gids)] = True
    res = Reservation(job.job_id, job.priority, start, mask)
    waited = released[lo]
    which = f"job {waited[0]} is" if len(waited) == 1 else f"jobs {_id_list(waited)} are"
    return res, f"reserved to start at {_iso(start)} when {which} expected to end"


def _id_list(ids: list[int], shown: int = 5) -> str:
    head = ", ".join(str(i) for i in ids[:shown])
    return f"{head} and {len(ids) - shown} more" if len(ids) > shown else head


def _backfill_blocked(res: Reservation, job: QueuedJob, now: datetime) -> tuple[str, bool]:
    """Why `job` may not start ahead of the reservation ("" if it may), and whether it must stay
    off the reserved GPUs (it runs past the reserved start)."""
    runtime = job.spec.estimated_runtime_s
    if res.start is None:
        return f"{res.text()}; nothing can be backfilled past it", False
    if runtime is None:
        return f"{res.text()}; without estimated_runtime_s it cannot be backfilled", False
    if now + timedelta(seconds=runtime) <= res.start:
        return "", False
    return "", True


def _stopping_text(victims: list[ActiveJob]) -> str:
    """Why a preemptor waits: its victims' ranks, or ranks stopping already, hold its GPUs."""
    ids = sorted(v.job_id for v in victims if v.launched)
    if not ids:
        return "waiting for the ranks of stopped jobs to exit; the GPUs they release are held for it"
    which = f"job {ids[0]}" if len(ids) == 1 else f"jobs {_id_list(ids)}"
    return f"preempting {which}: waiting for its ranks to exit; its GPUs are held for this job until then"


def _preempt_for(
    snapshot: ClusterSnapshot,
    job: QueuedJob,
    policy: str,
    free: np.ndarray,
    load: dict[str, float],
    evicted: set[int],
    alone: bool = False,
    by_priority: bool = True,
    reclaim: bool = False,
    preemptible=None,
) -> tuple[list[ActiveJob], Placement | None]:
    """The fewest victims whose GPUs let `job` fit on `free` (which may count GPUs still stopping),
    and its placement; ([], None) when no such set exists. Victims: `by_priority`, active jobs of
    lower effective priority; `reclaim`, other accounts' borrowed jobs. Borrowed jobs go first,
    then the lowest priority, then the most recent. `preemptible` (a QOS id -> bool test, or
    None): jobs of preemptible QOS too, and they go first with borrowed ones. `alone`: try `free`
    without victims first (([], placement) if it fits)."""

    def first(a: ActiveJob) -> bool:
        return a.borrowed or (preemptible is not None and preemptible(a.qos))

    def may_take(a: ActiveJob) -> bool:
        if by_priority and a.rank < job.rank:
            return True
        if preemptible is not None and preemptible(a.qos):
            return True
        return reclaim and a.borrowed and a.account != job.account

    # A migrating job is between generations: its GPUs are promised to its own next one.
    candidates = [a for a in snapshot.active if a.job_id not in evicted and not a.migrating and may_take(a)]
    # Lowest priority first; among equals the most recently started loses the least work.
    candidates.sort(
        key=lambda a: (not first(a), a.rank, -(a.begin.timestamp() if a.begin else 0.0), -a.job_id)
    )
    trial_free = free.copy()
    trial_load = dict(load)
    chosen: list[ActiveJob] = []
    # Without victims first, when GPUs still stopping may be enough (`free` has more than before).
    for victim in [None, *candidates] if alone else candidates:
        if victim is not None:
            trial_free[list(victim.gids)] = True
            _subtract(trial_load, victim.flows)
            chosen.append(victim)
        if int(np.count_nonzero(trial_free)) < job.spec.gpus:
            continue
        result = place(snapshot.topology, trial_free, trial_load, job.spec, policy=policy)
        if isinstance(result, NoFit):
            continue
        used = set(result.gids)
        # Only preempt the victims whose GPUs the placement actually uses.
        needed = [v for v in chosen if used.intersection(v.gids)]
        return needed, result
    return [], None


@dataclass(frozen=True, slots=True)
class MigrationOption:
    """A better placement for an active job: gids, predicted step times (ms) and gain fraction."""

    job_id: int
    old_gids: tuple[int, ...]
    new_gids: tuple[int, ...]
    old_step_ms: float
    new_step_ms: float
    gain: float
    placement: Placement


def migration_option(
    snapshot: ClusterSnapshot, active: ActiveJob, spec, *, policy: str = "topo", min_gain: float = 0.05
) -> MigrationOption | None:
    """The `policy` placement of an active job on the free GPUs plus its own, when it predicts a
    step time more than `min_gain` (fraction) shorter than its current placement's; else None."""
    topo = snapshot.topology
    free = snapshot.free.copy()
    free[list(active.gids)] = True
    load = dict(snapshot.link_load)
    _subtract(load, active.flows)
    result = place(topo, free, load, spec, policy=policy)
    if isinstance(result, NoFit) or tuple(result.gids) == tuple(active.gids):
        return None
    old = evaluate(topo, spec, active.gids, load)
    new_ms = float(result.prediction.step_ms)
    old_ms = float(old.step_ms)
    if old_ms <= 0:
        return None
    gain = (old_ms - new_ms) / old_ms
    if gain <= min_gain:
        return None
    return MigrationOption(
        active.job_id, tuple(active.gids), tuple(result.gids), old_ms, new_ms, gain, result
    )

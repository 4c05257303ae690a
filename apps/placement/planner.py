"""One scheduling cycle planned over plain data: gang placement, EASY backfill and preemption.

No database here: the cycle service hands in a `ClusterSnapshot` and the queue, and commits the
returned `CyclePlan` in one transaction.

EASY backfill: the first job that cannot be placed (the head) gets a reservation at the earliest
time T when enough GPUs are expected free, counting the active jobs' expected ends (start, or
placement, plus estimated_runtime_s) in order. A lower-priority job may start before the head
only if it has an estimated runtime and either ends by T, or fits in the GPUs the head will not
need at T. The reservation counts GPUs, not shapes: when enough GPUs are already free but the
head's shape does not fit, T is the next expected end and no GPUs are spare. A running job with no
estimate has no expected end; if the head needs its GPUs, T is unknown and nothing is backfilled.

Preemption takes the fewest lower-priority active jobs. A victim whose ranks run under node
agents frees its GPUs only once they exited, so it is preempted in two phases: this cycle it is
told to stop and its preemptor waits, holding the GPUs it will use (the victim's, still busy,
plus free ones) against every job behind it; a later cycle, when the snapshot shows them free,
books it. Meanwhile GPUs still stopping count for it, so it never takes a second victim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from .costmodel import evaluate
from .planning import ActiveJob, ClusterSnapshot, QueuedJob
from .solvers import NoFit, Placement, place
from .solvers.base import shortage
from .topology import shorten


@dataclass(slots=True)
class Booking:
    """A queued job to place on `placement.gids`."""

    job: QueuedJob
    placement: Placement


@dataclass(slots=True)
class Eviction:
    """An active job to preempt so that job `by_job` (priority `by_priority`) can start. A victim
    whose ranks run under agents is `stopping`: its GPUs stay allocated until every rank exited,
    and `by_job` is placed by a later cycle, not this one."""

    victim: ActiveJob
    by_job: int
    by_priority: int
    stopping: bool = False


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
    """The head job's reserved start `start` (None if unknown) and GPUs spare at that time."""

    job_id: int
    priority: int
    start: datetime | None
    spare: int
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
) -> CyclePlan:
    """Walk `queue` (already by priority, then age) and decide every job's fate this cycle."""
    topo = snapshot.topology
    free = snapshot.free.copy()
    load = dict(snapshot.link_load)
    plan = CyclePlan(overdue=overdue_flags(snapshot.active, now))
    # Jobs that hold or will hold GPUs after this cycle, for the reservation's release times.
    holders: dict[int, tuple[int, datetime | None]] = {
        a.job_id: (len(a.gids), a.expected_end) for a in snapshot.active
    }
    evicted: set[int] = set()
    # GPUs that free up once their ranks exited, not yet held for a preemptor this cycle.
    stopping = np.zeros_like(free) if snapshot.stopping is None else snapshot.stopping.copy()
    no_fit: dict[tuple, NoFit] = {}
    reservation: Reservation | None = None
    for job in queue:
        # One job's evaluation must not stop the cycle for the others: everything that may raise
        # (solvers, cost model, dates) runs before this job changes the plan's free GPUs or loads.
        try:
            spec = job.spec
            policy = job.policy or cluster_policy
            if reservation is not None and not backfill:
                plan.waiting[job.job_id] = f"{reservation.text()}; backfill is off on this cluster"
                continue
            uses_spare = False
            if reservation is not None:
                # Decided before placing: a job that may not jump the head costs no solver time.
                blocked, uses_spare = _backfill_blocked(reservation, job, now)
                if blocked:
                    plan.waiting[job.job_id] = blocked
                    continue
            shape = (policy, spec.gpus, spec.tp, spec.pp, spec.dp, spec.ep, spec.rank_order)
            # Too few GPUs free: every solver says so first; asking it costs more in a long queue.
            result = shortage(spec, free)
            if result is None and shape in no_fit:
                # Free GPUs only shrink during the walk: a shape that did not fit still does not.
                result = no_fit[shape]
            elif result is None:
                result = place(topo, free, load, spec, policy=policy)
            if isinstance(result, NoFit):
                no_fit[shape] = result
            if isinstance(result, Placement):
                end = _end(now, spec.estimated_runtime_s)
                if uses_spare:
                    reservation.spare -= spec.gpus
                _take(free, load, result)
                plan.bookings.append(Booking(job, result))
                holders[job.job_id] = (spec.gpus, end)
                continue
            if reservation is None and preemption:
                victims, placed = _preempt_for(
                    snapshot, job, policy, free | stopping, load, evicted, alone=bool(stopping.any())
                )
                if placed is not None:
                    end = _end(now, spec.estimated_runtime_s)
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
                        plan.evictions.append(Eviction(victim, job.job_id, job.priority, victim.launched))
                    if waits:
                        # Held for it: no job behind it takes these GPUs while the ranks stop.
                        free[gids] = False
                        stopping[gids] = False
                        holders[job.job_id] = (spec.gpus, end)
                        plan.waiting[job.job_id] = _stopping_text(victims)
                        continue
                    _take(free, load, placed)
                    plan.bookings.append(Booking(job, placed))
                    holders[job.job_id] = (spec.gpus, end)
                    continue
            if reservation is None:
                reservation, why = _reserve(job, int(np.count_nonzero(free)), holders, now)
                plan.waiting[job.job_id] = f"{result.reason}; {why}"
            else:
                plan.waiting[job.job_id] = result.reason
        except Exception as exc:
            plan.failed[job.job_id] = shorten(f"{type(exc).__name__}: {exc}", 500)
    return plan


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


def _reserve(
    job: QueuedJob, n_free: int, holders: dict[int, tuple[int, datetime | None]], now: datetime
) -> tuple[Reservation, str]:
    """The head's reservation and the text of when it is expected to start."""
    need = job.spec.gpus
    ends = sorted((end, gpus, jid) for jid, (gpus, end) in holders.items() if end is not None)
    unknown = sorted(jid for jid, (_, end) in holders.items() if end is None)
    if n_free >= need:
        # Enough GPUs, wrong shape: the next release is the next chance; nothing is spare.
        if not ends:
            res = Reservation(job.job_id, job.priority, None, 0)
            return res, "the free GPUs do not form the shape it needs and no running job has an expected end"
        start = max(ends[0][0], now)
        res = Reservation(job.job_id, job.priority, start, 0)
        return res, f"reserved to start at {_iso(start)} when job {ends[0][2]} is expected to end"
    count, waited = n_free, []
    for end, gpus, jid in ends:
        count += gpus
        waited.append(jid)
        if count >= need:
            start = max(end, now)
            res = Reservation(job.job_id, job.priority, start, count - need)
            which = f"job {waited[0]} is" if len(waited) == 1 else f"jobs {_id_list(waited)} are"
            return res, f"reserved to start at {_iso(start)} when {which} expected to end"
    res = Reservation(job.job_id, job.priority, None, 0)
    names = _id_list(unknown) or "none"
    return res, f"start time unknown: it needs GPUs of jobs without estimated_runtime_s ({names})"


def _id_list(ids: list[int], shown: int = 5) -> str:
    head = ", ".join(str(i) for i in ids[:shown])
    return f"{head} and {len(ids) - shown} more" if len(ids) > shown else head


def _backfill_blocked(res: Reservation, job: QueuedJob, now: datetime) -> tuple[str, bool]:
    """Why `job` may not start ahead of the reservation ("" if it may), and whether starting it
    would use GPUs that are spare at the reserved start (it runs past that time)."""
    runtime = job.spec.estimated_runtime_s
    if res.start is None:
        return f"{res.text()}; nothing can be backfilled past it", False
    if runtime is None:
        return f"{res.text()}; without estimated_runtime_s it cannot be backfilled", False
    if now + timedelta(seconds=runtime) <= res.start:
        return "", False
    if job.spec.gpus <= res.spare:
        return "", True
    return (
        f"{res.text()}; it would run {runtime:.0f} s, past that start, and needs {job.spec.gpus} GPUs"
        f" with {res.spare} spare then"
    ), False


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
) -> tuple[list[ActiveJob], Placement | None]:
    """The fewest lower-priority active jobs (lowest priority, then most recent, first) whose GPUs
    let `job` fit on `free` (which may count GPUs still stopping), and its placement; ([], None)
    when no such set exists. `alone`: try `free` without victims first (([], placement) if it fits)."""
    # A migrating job is between generations: its GPUs are promised to its own next one.
    candidates = [
        a
        for a in snapshot.active
        if a.priority < job.priority and a.job_id not in evicted and not a.migrating
    ]
    # Lowest priority first; among equals the most recently started loses the least work.
    candidates.sort(key=lambda a: (a.priority, -(a.begin.timestamp() if a.begin else 0.0), -a.job_id))
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

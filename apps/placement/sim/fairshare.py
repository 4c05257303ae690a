"""Fair share replayed: accounts submitting the same stream of jobs to one cluster, scheduled by the
production planner (`planner.plan_cycle`) with the production effective priority
(`priority.priority_terms` over `priority.decayed_gpu_seconds` and `priority.fair_share_factors`).

Every `interval_s` each account submits one copy of `job`; jobs run exactly their
`estimated_runtime_s`. At every arrival or completion the cycle runs: queued and running jobs get
their effective priorities from the accounts' decayed use so far, the queue is ordered by it (then
age), and the plan's bookings start. GPU-hours are counted per account from start to end (running
jobs up to the end of the replay). Nothing here is random: a run is a function of its inputs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import numpy as np

from ..jobs import JobSpec
from ..planner import plan_cycle
from ..planning import ActiveJob, ClusterSnapshot, GpuIndex, QosLimits, QueuedJob
from ..priority import PriorityWeights, Usage, decayed_gpu_seconds, fair_share_factors, priority_terms
from ..topology import Topology

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class FairShareRun:
    """GPU-hours and jobs started per account, cycles run, and each account's GPU-hours by hour."""

    gpu_hours: dict[str, float]
    started: dict[str, int]
    cycles: int
    hourly: dict[str, list[float]] = field(default_factory=dict)

    def ratio(self, a: str, b: str) -> float:
        """GPU-hours of `b` over those of `a` (inf when `a` got none)."""
        return self.gpu_hours[b] / self.gpu_hours[a] if self.gpu_hours[a] > 0 else float("inf")


def replay_fair_share(
    topology: Topology,
    job: JobSpec,
    *,
    shares: dict[str, int],
    duration_s: float,
    interval_s: float,
    half_life_s: float = 24 * 3600.0,
    weights: PriorityWeights = PriorityWeights(),  # noqa: B008  (frozen)
    policy: str = "tree_best_fit",
    qos: QosLimits | None = None,
) -> FairShareRun:
    """Replay `duration_s` seconds of every account of `shares` submitting `job` every `interval_s`,
    every job in QOS `qos` when given (its priority term and limits apply as in production)."""
    names = sorted(shares)
    ids = {name: i for i, name in enumerate(names)}
    runtime_s = float(job.estimated_runtime_s or 3600.0)
    free = np.ones(topology.n_gpus, dtype=bool)
    queue: list[QueuedJob] = []
    running: dict[int, tuple[ActiveJob, float]] = {}
    ends: list[tuple[float, int]] = []
    usage: list[Usage] = []
    account_of: dict[int, int] = {}
    started = dict.fromkeys(names, 0)
    next_id, next_arrival, cycles = 0, 0.0, 0
    index = GpuIndex((), {}, ())
    while True:
        t = min(next_arrival, ends[0][0] if ends else float("inf"))
        if t >= duration_s:
            break
        now = EPOCH + timedelta(seconds=t)
        while ends and ends[0][0] <= t:
            _, jid = heapq.heappop(ends)
            active, _ = running.pop(jid)
            free[list(active.gids)] = True
        while next_arrival <= t:
            for name in names:
                account_of[next_id] = ids[name]
                queue.append(
                    QueuedJob(
                        next_id,
                        job.priority,
                        EPOCH + timedelta(seconds=next_arrival),
                        job,
                        None,
                        "",
                        ids[name],
                        qos=qos.qos_id if qos is not None else None,
                    )
                )
                next_id += 1
            next_arrival += interval_s
        if not queue:
            continue
        factors = fair_share_factors(
            decayed_gpu_seconds(usage, now=now, half_life_s=half_life_s),
            {ids[n]: float(s) for n, s in shares.items()},
        )

        queue = [
            replace(
                q, effective=_effective(q.priority, q.submitted_at, now, factors[q.account], weights, qos)
            )
            for q in queue
        ]
        queue.sort(key=lambda q: (-q.rank, q.submitted_at, q.job_id))
        active = [
            replace(
                a,
                effective=_effective(
                    a.priority, a.submitted_at or now, now, factors[a.account], weights, qos
                ),
            )
            for a, _ in running.values()
        ]
        snapshot = ClusterSnapshot(0, topology, index, free.copy(), {}, active)
        plan = plan_cycle(
            snapshot,
            queue,
            cluster_policy=policy,
            backfill=True,
            preemption=False,
            now=now,
            qos={qos.qos_id: qos} if qos is not None else None,
        )
        cycles += 1
        booked = set()
        for b in plan.bookings:
            q = b.job
            gids = tuple(int(g) for g in b.placement.gids)
            free[list(gids)] = False
            end = now + timedelta(seconds=runtime_s)
            running[q.job_id] = (
                ActiveJob(
                    q.job_id,
                    q.priority,
                    gids,
                    {},
                    now,
                    end,
                    True,
                    now,
                    runtime_s,
                    account=q.account,
                    submitted_at=q.submitted_at,
                    qos=q.qos,
                ),
                t,
            )
            heapq.heappush(ends, (t + runtime_s, q.job_id))
            usage.append(Usage(q.account, len(gids), now, end))
            started[names[q.account]] += 1
            booked.add(q.job_id)
        queue = [q for q in queue if q.job_id not in booked]
    gpu_hours = dict.fromkeys(names, 0.0)
    hours = int(np.ceil(duration_s / 3600.0))
    hourly = {n: [0.0] * hours for n in names}
    stop = EPOCH + timedelta(seconds=duration_s)
    for u in usage:
        end = min(u.end or stop, stop)
        name = names[u.account]
        gpu_hours[name] += u.gpus * (end - u.begin).total_seconds() / 3600.0
        for h in range(hours):
            lo = max(u.begin, EPOCH + timedelta(hours=h))
            hi = min(end, EPOCH + timedelta(hours=h + 1))
            if hi > lo:
                hourly[name][h] += u.gpus * (hi - lo).total_seconds() / 3600.0
    return FairShareRun(gpu_hours, started, cycles, hourly)


def _effective(
    requested: int,
    submitted: datetime,
    now: datetime,
    factor: float,
    weights: PriorityWeights,
    qos: QosLimits | None = None,
) -> float:
    return priority_terms(
        requested=requested,
        submitted_at=submitted,
        now=now,
        fair_share_factor=factor,
        weights=weights,
        qos_priority=qos.priority if qos is not None else 0,
    ).effective

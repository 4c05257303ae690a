"""Discrete-event replay of a trace on a topology under one policy, with the production planner.

Events are arrivals and completions. At every instant where one happened, the scheduling cycle
runs exactly as in production (`planner.plan_cycle`: priority then age, gangs all-or-nothing, EASY
backfill on estimated runtimes, preemption only when enabled). A job's work is its trace duration
at the ideal placement (the per-group lower bound, `bounds.lower_bound`); it progresses at
`ideal_step_ms / step_ms` of that per second, where `step_ms` is the cost model's price of its
placement under the link loads of the jobs running beside it. Whenever a job starts or ends, the
running jobs whose cross-leaf flows share a leaf with it are re-priced and their ends moved.
With `migration`, every `migration_interval_s` the planner's migration option is taken for each
running job whose placement it improves by more than `migration_min_gain`; a move costs
`restart_cost_s` of extra work. Nothing here is random: a run is a function of its inputs.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np

from ..bounds import lower_bound
from ..costmodel import evaluate
from ..jobs import JobSpec
from ..planner import migration_option, plan_cycle
from ..planning import ActiveJob, ClusterSnapshot, GpuIndex, QueuedJob
from ..solvers import NoFit, Placement, place
from ..topology import Topology
from .profiles import Profile

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
FRAGMENT_GPUS = 8  # a free GPU is fragmented when its NVLink domain has fewer free than this
WINDOW_QUANTILE = 0.01  # the arrival window leaves out this share of arrivals at either end
_NO_INDEX = GpuIndex((), {}, ())


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Scheduler settings of a replay (times in s, gain as a fraction of step time)."""

    backfill: bool = True
    preemption: bool = False
    migration: bool = False
    migration_interval_s: float = 3600.0
    migration_min_gain: float = 0.05
    restart_cost_s: float = 300.0


@dataclass(slots=True)
class JobOutcome:
    """One finished job: times in s from the trace start, step times in ms, GPU-seconds spent
    communicating and MFU x GPU-seconds (for the cluster's effective MFU)."""

    job_id: int
    profile: str
    gpus: int
    arrival_s: float
    start_s: float
    end_s: float
    ideal_runtime_s: float
    ideal_step_ms: float
    first_step_ms: float
    comm_gpu_s: float = 0.0
    mfu_gpu_s: float = 0.0

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s

    @property
    def queued_s(self) -> float:
        return self.start_s - self.arrival_s


@dataclass(slots=True)
class PolicyRun:
    """A replay's outcome: finished jobs, rejected jobs (id -> reason), and the cluster over time
    (event times in s, busy GPUs, fragmented share of free GPUs)."""

    policy: str
    n_gpus: int
    outcomes: list[JobOutcome] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)
    times_s: list[float] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)
    fragmentation: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # jobs queued after each event
    window_s: tuple[float, float] = (0.0, 0.0)  # the arrival window (`arrival_window`)
    cycles: int = 0
    cpu_s: float = 0.0  # CPU time of the replay (not in the summary: a run's result is its inputs')
    migrations: int = 0
    preemptions: int = 0


@dataclass(slots=True)
class _Run:
    """A running job's state: `left_s` is work still to do in ideal-placement seconds."""

    job_id: int
    spec: JobSpec
    outcome: JobOutcome
    gids: tuple[int, ...]
    own: np.ndarray  # its flows per leaf
    leaves: frozenset[int]
    active: ActiveJob
    step_ms: float
    comm_share: float
    mfu: float
    left_s: float
    since_s: float
    version: int = 0

    @property
    def rate(self) -> float:
        ideal = self.outcome.ideal_step_ms
        # A step the cost model prices at 0 (no compute, no traffic) runs at the trace's pace.
        return ideal / self.step_ms if self.step_ms > 0 and ideal > 0 else 1.0


class Replay:
    """One policy's replay of `profiles` (arrival times `arrivals_s`) on `topology`."""

    def __init__(
        self,
        topology: Topology,
        profiles: list[Profile],
        arrivals_s: list[float],
        policy: str,
        config: SimConfig,
        ideal_step_ms: dict[tuple, float],
    ):
        self.topo = topology
        self.profiles = profiles
        self.arrivals = arrivals_s
        self.policy = policy
        self.config = config
        self.ideal = ideal_step_ms
        self.free = np.ones(topology.n_gpus, dtype=bool)
        self.load = np.zeros(len(topology.leaf_names))
        self.running: dict[int, _Run] = {}
        self.queue: list[QueuedJob] = []
        self.left: dict[int, float] = {}  # preempted or moved jobs' remaining work
        self.kept: dict[int, JobOutcome] = {}  # and their outcome records
        self.ends: list[tuple[float, int, int]] = []  # (time, job id, version)
        self.result = PolicyRun(policy, topology.n_gpus, window_s=arrival_window(arrivals_s))
        self.fits: dict[tuple, str] = {}
        self.versions = 0
        self.n_domains = len(topology.domain_names)

    def run(self, progress: Callable[[int, int], None] | None = None) -> PolicyRun:
        """Replay every job to completion; `progress(done, total)` is called as jobs finish."""
        total = len(self.profiles)
        step = max(1, total // 200)
        nxt, done = 0, 0
        next_migration = self.config.migration_interval_s
        started = time.process_time()
        while nxt < total or self.ends:
            # An end moved by a re-pricing leaves its old entry behind: no event, no cycle there.
            while self.ends and self._stale(self.ends[0]):
                heapq.heappop(self.ends)
            if nxt >= total and not self.ends:
                break
            t = min(self.arrivals[nxt] if nxt < total else np.inf, self.ends[0][0] if self.ends else np.inf)
            if self.config.migration and self.running:
                t = min(t, next_migration)
            changed = np.zeros(len(self.load), dtype=bool)
            while self.ends and self.ends[0][0] <= t:
                _, job_id, version = heapq.heappop(self.ends)
                run = self.running.get(job_id)
                if run is None or run.version != version:
                    continue
                self._finish(run, t, changed)
                done += 1
                if progress is not None and done % step == 0:
                    progress(done + len(self.result.rejected), total)
            while nxt < total and self.arrivals[nxt] <= t:
                self._arrive(nxt, t)
                nxt += 1
            if self.queue:
                self._cycle(t, changed)
            if self.config.migration and t >= next_migration:
                self._migrate(t, changed)
                next_migration = t + self.config.migration_interval_s
            if changed.any():
                self._reprice(t, changed)
            self._sample(t)
        if progress is not None:
            progress(total, total)
        self.result.outcomes.sort(key=lambda o: o.job_id)
        self.result.cpu_s = time.process_time() - started
        return self.result

    def _stale(self, entry: tuple[float, int, int]) -> bool:
        run = self.running.get(entry[1])
        return run is None or run.version != entry[2]

    def _arrive(self, job_id: int, t: float) -> None:
        prof = self.profiles[job_id]
        why = self._never_fits(prof)
        if why:
            self.result.rejected[job_id] = why
            return
        self.queue.append(QueuedJob(job_id, prof.spec.priority, _at(t), prof.spec, None, ""))

    def _never_fits(self, prof: Profile) -> str:
        """Why the job cannot run even on the empty cluster ("" if it can); production refuses
        such a job at submission, so it never enters the queue."""
        if prof.key not in self.fits:
            if prof.spec.gpus > self.topo.n_gpus:
                why = f"needs {prof.spec.gpus} GPUs, the cluster has {self.topo.n_gpus}"
            else:
                empty = place(self.topo, np.ones(self.topo.n_gpus, dtype=bool), {}, prof.spec, self.policy)
                why = empty.reason if isinstance(empty, NoFit) else ""
            self.fits[prof.key] = why
        return self.fits[prof.key]

    def _snapshot(self) -> ClusterSnapshot:
        names = self.topo.leaf_names
        load = {names[i]: float(v) for i, v in enumerate(self.load) if v > 0}
        active = [r.active for r in self.running.values()]
        return ClusterSnapshot(0, self.topo, _NO_INDEX, self.free, load, active)

    def _cycle(self, t: float, changed: np.ndarray) -> None:
        self.result.cycles += 1
        plan = plan_cycle(
            self._snapshot(),
            self.queue,
            cluster_policy=self.policy,
            backfill=self.config.backfill,
            preemption=self.config.preemption,
            now=_at(t),
        )
        for eviction in plan.evictions:
            self._preempt(self.running[eviction.victim.job_id], t, changed)
        started = set()
        for booking in plan.bookings:
            self._start(booking.job, booking.placement, t, changed)
            started.add(booking.job.job_id)
        if started:
            self.queue = [q for q in self.queue if q.job_id not in started]
        if plan.evictions:
            self.queue.sort(key=lambda q: (-q.priority, q.submitted_at, q.job_id))

    def _start(self, job: QueuedJob, placement: Placement, t: float, changed: np.ndarray) -> None:
        prof = self.profiles[job.job_id]
        prediction = placement.prediction
        own = self._flows(prediction.flows)
        outcome = self._outcome(job.job_id, prof, t, float(prediction.step_ms))
        left = self.left.pop(job.job_id, prof.spec.estimated_runtime_s)
        active = ActiveJob(
            job.job_id,
            job.priority,
            tuple(placement.gids),
            dict(prediction.flows),
            _at(t),
            _at(t + prof.spec.estimated_runtime_s),
            True,
            _at(t),
            prof.spec.estimated_runtime_s,
        )
        run = _Run(
            job.job_id,
            prof.spec,
            outcome,
            tuple(placement.gids),
            own,
            frozenset(np.flatnonzero(own).tolist()),
            active,
            0.0,
            0.0,
            0.0,
            left,
            t,
        )
        self._price(run, prediction)
        self.free[list(run.gids)] = False
        self.load += own
        changed |= own > 0
        self.running[job.job_id] = run
        self._schedule_end(run, t)

    def _outcome(self, job_id: int, prof: Profile, t: float, step_ms: float) -> JobOutcome:
        """The outcome record of a job starting at `t` (the first one, after a preemption or move)."""
        kept = self.kept.pop(job_id, None)
        if kept is not None:
            return kept
        return JobOutcome(
            job_id,
            prof.profile,
            prof.spec.gpus,
            self.arrivals[job_id],
            t,
            t,
            prof.spec.estimated_runtime_s,
            self.ideal[prof.key],
            step_ms,
        )

    def _flows(self, flows) -> np.ndarray:
        own = np.zeros(len(self.load))
        index = self.topo.leaf_by_name
        for leaf, f in flows.items():
            own[index[leaf]] += float(f)
        return own

    def _price(self, run: _Run, prediction) -> None:
        step = float(prediction.step_ms)
        run.step_ms = step
        run.comm_share = min(float(prediction.comm_ms) / step, 1.0) if step > 0 else 0.0
        run.mfu = float(prediction.mfu or 0.0)

    def _advance(self, run: _Run, t: float) -> None:
        """Account the work, communication and MFU of `run` from its last update to `t`."""
        dt = t - run.since_s
        if dt <= 0:
            return
        gpu_s = dt * len(run.gids)
        run.left_s -= dt * run.rate
        run.outcome.comm_gpu_s += gpu_s * run.comm_share
        run.outcome.mfu_gpu_s += gpu_s * run.mfu
        run.since_s = t

    def _schedule_end(self, run: _Run, t: float) -> None:
        # One counter for all runs: a restarted job's new end never matches its old one's version.
        self.versions += 1
        run.version = self.versions
        heapq.heappush(self.ends, (t + max(run.left_s, 0.0) / run.rate, run.job_id, run.version))

    def _release(self, run: _Run, t: float, changed: np.ndarray) -> None:
        self._advance(run, t)
        del self.running[run.job_id]
        self.free[list(run.gids)] = True
        self.load -= run.own
        # Float residue from repeated add/subtract must not read as load.
        self.load[self.load < 1e-9] = 0.0
        changed |= run.own > 0

    def _finish(self, run: _Run, t: float, changed: np.ndarray) -> None:
        self._release(run, t, changed)
        run.outcome.end_s = t
        self.result.outcomes.append(run.outcome)

    def _preempt(self, run: _Run, t: float, changed: np.ndarray) -> None:
        self._release(run, t, changed)
        self.result.preemptions += 1
        self.left[run.job_id] = max(run.left_s, 0.0) + self.config.restart_cost_s
        self.kept[run.job_id] = run.outcome
        prof = self.profiles[run.job_id]
        self.queue.append(
            QueuedJob(run.job_id, prof.spec.priority, _at(run.outcome.arrival_s), prof.spec, None, "")
        )

    def _reprice(self, t: float, changed: np.ndarray) -> None:
        """Re-price the running jobs with flows on a leaf whose load changed, and move their ends."""
        hit = set(np.flatnonzero(changed).tolist())
        for run in self.running.values():
            if not run.leaves or run.leaves.isdisjoint(hit):
                continue
            self._advance(run, t)
            prediction = evaluate(self.topo, run.spec, run.gids, np.maximum(self.load - run.own, 0.0))
            if float(prediction.step_ms) == run.step_ms:
                continue
            self._price(run, prediction)
            self._schedule_end(run, t)

    def _migrate(self, t: float, changed: np.ndarray) -> None:
        """Apply the planner's migration option to each running job it improves."""
        for job_id in sorted(self.running):
            run = self.running[job_id]
            option = migration_option(
                self._snapshot(),
                run.active,
                run.spec,
                policy=self.policy,
                min_gain=self.config.migration_min_gain,
            )
            if option is None:
                continue
            self._release(run, t, changed)
            self.result.migrations += 1
            self.left[job_id] = max(run.left_s, 0.0) + self.config.restart_cost_s
            self.kept[job_id] = run.outcome
            self._start(
                QueuedJob(job_id, run.active.priority, _at(t), run.spec, None, ""),
                option.placement,
                t,
                changed,
            )

    def _sample(self, t: float) -> None:
        free = self.free
        n_free = int(np.count_nonzero(free))
        frag = 0.0
        if n_free:
            per_domain = np.bincount(self.topo.gpu_domain[free], minlength=self.n_domains)
            frag = float(per_domain[per_domain < FRAGMENT_GPUS].sum()) / n_free
        res = self.result
        if res.times_s and res.times_s[-1] == t:
            res.busy[-1], res.fragmentation[-1] = self.topo.n_gpus - n_free, frag
            res.waiting[-1] = len(self.queue)
            return
        res.times_s.append(t)
        res.busy.append(self.topo.n_gpus - n_free)
        res.fragmentation.append(frag)
        res.waiting.append(len(self.queue))


def arrival_window(arrivals_s) -> tuple[float, float]:
    """The span of a trace's arrivals that load and utilisation are measured over: from the
    1st to the 99th percentile (the whole span under 100 jobs), so that a few stray jobs long
    before or after the rest do not stretch it."""
    a = np.asarray(arrivals_s, dtype=float)
    if a.size == 0:
        return 0.0, 0.0
    if a.size < 100:
        return float(a.min()), float(a.max())
    first, last = np.quantile(a, [WINDOW_QUANTILE, 1.0 - WINDOW_QUANTILE])
    return float(first), float(last)


def _at(t_s: float) -> datetime:
    return EPOCH + timedelta(seconds=t_s)


def ideal_steps(topology: Topology, profiles: list[Profile]) -> dict[tuple, float]:
    """Step time (ms) of each profile shape at its ideal placement (the per-group lower bound)."""
    out: dict[tuple, float] = {}
    for prof in profiles:
        if prof.key not in out:
            if prof.spec.gpus > topology.n_gpus:
                out[prof.key] = float(prof.spec.compute_ms)
            else:
                out[prof.key] = float(lower_bound(topology, prof.spec).step_ms)
    return out

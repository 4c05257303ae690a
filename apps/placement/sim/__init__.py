"""Trace-driven simulator: replay a cluster trace on a topology under each placement policy.

`simulate(topology, trace, policies)` assigns the trace's jobs their workload profiles (seeded,
`profiles`), replays them once per policy with the production planner (`engine`) and summarizes
each run (`metrics`). The result is a function of the inputs and the seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..solvers import POLICIES
from ..topology import Topology
from .engine import PolicyRun, Replay, SimConfig, arrival_window, ideal_steps
from .metrics import chart_series, summarize
from .profiles import assign_profiles, unknown_models
from .traces import FORMATS, TraceError, TraceJob, TraceRead, read_trace

MAX_LOAD = 10.0


@dataclass(slots=True)
class Comparison:
    """Every policy's replay of one trace: runs and summaries by policy, plus the trace's facts."""

    topology: str
    n_gpus: int
    trace: dict
    runs: dict[str, PolicyRun] = field(default_factory=dict)
    summaries: dict[str, dict] = field(default_factory=dict)

    def as_dict(self, *, series: bool = False) -> dict:
        """The JSON summary: topology, trace facts and each policy's metrics; with `series`, also
        each policy's JCT CDF and utilisation and fragmentation over time (for charts)."""
        out = {
            "topology": self.topology,
            "n_gpus": self.n_gpus,
            "trace": self.trace,
            "policies": self.summaries,
        }
        if series:
            out["series"] = {policy: chart_series(run) for policy, run in self.runs.items()}
        return out


def offered_load(jobs: list[TraceJob], n_gpus: int, scale: float = 1.0) -> float:
    """The mean share of the cluster the jobs ask for over the arrival window (`arrival_window`,
    arrival times multiplied by `scale`): each job holds its GPUs from its arrival for its
    duration (its runtime at the ideal placement), counted only inside the window, so a job that
    runs for months past it weighs what it asks of the window, not its whole length. 0 when the
    window is empty."""
    if len(jobs) < 2:
        return 0.0
    arrivals = np.array([j.arrival_s for j in jobs], dtype=float) * scale
    first, last = arrival_window(arrivals)
    if last <= first:
        return 0.0
    gpus = np.array([j.gpus for j in jobs], dtype=float)
    ends = arrivals + np.array([j.duration_s for j in jobs], dtype=float)
    held = np.clip(np.minimum(ends, last) - np.maximum(arrivals, first), 0.0, None)
    return float(gpus @ held) / ((last - first) * n_gpus)


def arrival_scale(jobs: list[TraceJob], n_gpus: int, load: float) -> tuple[float, float]:
    """The factor on arrival times at which `offered_load` is `load`, and the load it reaches.

    The load falls as the factor grows (the window widens in proportion, what jobs hold inside it
    less than that), so it is bisected on a log scale. Packing arrivals closer cannot raise it past
    every job holding its GPUs to the last arrival: when `load` lies beyond, the factor is the one
    that comes within 0.1% of that ceiling, and the load reached is returned with it."""
    if offered_load(jobs, n_gpus) <= 0:
        return 1.0, 0.0
    lo, hi = 1.0, 1.0
    while offered_load(jobs, n_gpus, hi) > load and hi < 1e12:
        hi *= 2.0
    while offered_load(jobs, n_gpus, lo) < load and lo > 1e-12:
        lo /= 2.0
    ceiling = offered_load(jobs, n_gpus, 1e-12)
    if ceiling < load:
        # Unreachable: the widest factor within 0.1% of the ceiling, not arrivals all at once.
        lo = 1e-12
        load = ceiling * 0.999
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if offered_load(jobs, n_gpus, mid) > load:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return hi, offered_load(jobs, n_gpus, hi)


def simulate(
    topology: Topology,
    trace: TraceRead,
    policies: list[str],
    *,
    seed: int = 0,
    config: SimConfig | None = None,
    load: float | None = None,
    moe_share: float = 0.2,
    progress: Callable[[str, int, int], None] | None = None,
) -> Comparison:
    """Replay `trace` under each of `policies`. `load`, when given, scales the arrival times so
    that the offered load (`offered_load`) is that fraction of the cluster, or as near as packing
    the arrivals can bring it (`scaled_load` in the facts). `progress(policy, done, total)`
    reports finished jobs."""
    for p in policies:
        if p not in POLICIES:
            raise ValueError(f"policies: must be among {', '.join(POLICIES)}, got {p!r}")
    if not policies:
        raise ValueError("policies: name at least one policy")
    jobs = trace.jobs
    offered = offered_load(jobs, topology.n_gpus)
    scale, scaled = 1.0, offered
    if load is not None:
        if not 0 < load <= MAX_LOAD:
            raise ValueError(f"load: must be in (0, {MAX_LOAD:g}], got {load!r}")
        scale, scaled = arrival_scale(jobs, topology.n_gpus, load)
    arrivals = [j.arrival_s * scale for j in jobs]
    profiles = assign_profiles(jobs, topology, seed=seed, moe_share=moe_share)
    ideal = ideal_steps(topology, profiles)
    mix: dict[str, int] = {}
    for prof in profiles:
        mix[prof.profile] = mix.get(prof.profile, 0) + 1
    facts = {
        "format": trace.fmt,
        "jobs": len(jobs),
        "malformed_rows": len(trace.malformed),
        "left_out": dict(trace.ignored),
        "mean_gpus": sum(j.gpus for j in jobs) / len(jobs) if jobs else 0.0,
        "offered_load": offered,
        "arrival_scale": scale,
        "scaled_load": scaled,
        "profiles": dict(sorted(mix.items())),
        # Jobs limited to some of the cluster's GPU models, and jobs naming only models it lacks.
        "gpu_model_constrained": sum(1 for p in profiles if p.spec.gpu_models),
        "gpu_models_unknown": unknown_models(jobs, topology),
        "seed": seed,
    }
    out = Comparison(topology.name, topology.n_gpus, facts)
    for policy in policies:
        report = None if progress is None else (lambda d, n, p=policy: progress(p, d, n))
        run = Replay(topology, profiles, arrivals, policy, config or SimConfig(), ideal).run(report)
        out.runs[policy] = run
        out.summaries[policy] = summarize(run)
    return out


__all__ = [
    "FORMATS",
    "Comparison",
    "PolicyRun",
    "SimConfig",
    "TraceError",
    "TraceJob",
    "TraceRead",
    "arrival_scale",
    "arrival_window",
    "offered_load",
    "read_trace",
    "simulate",
]

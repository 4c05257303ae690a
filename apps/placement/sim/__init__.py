"""Trace-driven simulator: replay a cluster trace on a topology under each placement policy.

`simulate(topology, trace, policies)` assigns the trace's jobs their workload profiles (seeded,
`profiles`), replays them once per policy with the production planner (`engine`) and summarizes
each run (`metrics`). The result is a function of the inputs and the seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..solvers import POLICIES
from ..topology import Topology
from .engine import PolicyRun, Replay, SimConfig, ideal_steps
from .metrics import chart_series, summarize
from .profiles import assign_profiles
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


def offered_load(jobs: list[TraceJob], n_gpus: int) -> float:
    """GPU-seconds the jobs ask for at their ideal runtimes over the cluster's GPU-seconds
    between the first and last arrival (0 when they all arrive at once)."""
    if len(jobs) < 2:
        return 0.0
    span = jobs[-1].arrival_s - jobs[0].arrival_s
    work = sum(j.gpus * j.duration_s for j in jobs)
    return work / (span * n_gpus) if span > 0 else 0.0


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
    that the offered load (`offered_load`) is that fraction of the cluster. `progress(policy,
    done, total)` reports finished jobs."""
    for p in policies:
        if p not in POLICIES:
            raise ValueError(f"policies: must be among {', '.join(POLICIES)}, got {p!r}")
    if not policies:
        raise ValueError("policies: name at least one policy")
    jobs = trace.jobs
    offered = offered_load(jobs, topology.n_gpus)
    scale = 1.0
    if load is not None:
        if not 0 < load <= MAX_LOAD:
            raise ValueError(f"load: must be in (0, {MAX_LOAD:g}], got {load!r}")
        if offered > 0:
            scale = offered / load
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
        "profiles": dict(sorted(mix.items())),
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
    "offered_load",
    "read_trace",
    "simulate",
]

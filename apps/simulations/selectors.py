"""Read side of the simulations app: runs to list and compare."""

from __future__ import annotations

from django.db.models import QuerySet

from .models import SimulationRun


def simulation_runs(*, limit: int = 100) -> QuerySet[SimulationRun]:
    """The latest runs, newest first, without their (large) results."""
    return SimulationRun.objects.defer("result").order_by("-created_at", "-id")[:limit]


def run_summaries(run: SimulationRun) -> dict[str, dict]:
    """A finished run's metrics by policy ({} until it is done)."""
    return (run.result or {}).get("policies", {})


def comparison_rows(runs: list[SimulationRun]) -> list[dict]:
    """One row per finished run and policy: mean JCT (h), p95 JCT (h), utilisation and
    fragmentation (fractions), and the ratio of its mean JCT to the run's naive policy."""
    rows = []
    for run in runs:
        policies = run_summaries(run)
        naive = (policies.get("naive") or {}).get("jct_s", {}).get("mean")
        for policy, s in policies.items():
            mean = s["jct_s"]["mean"]
            rows.append(
                {
                    "run": run,
                    "policy": policy,
                    "jct_mean_h": None if mean is None else mean / 3600,
                    "jct_p95_h": None if s["jct_s"]["p95"] is None else s["jct_s"]["p95"] / 3600,
                    "utilisation": s["utilisation"],
                    "fragmentation": s["fragmentation"],
                    "vs_naive": mean / naive if mean is not None and naive else None,
                }
            )
    return rows

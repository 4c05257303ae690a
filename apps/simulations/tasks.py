"""Celery task of the simulations app: a thin wrapper that takes the run id."""

from __future__ import annotations

from celery import shared_task

# A replay of thousands of jobs under four policies outlives the default task time limit.
RUN_TIME_LIMIT_S = 3600


@shared_task(
    name="simulations.run",
    ignore_result=True,
    time_limit=RUN_TIME_LIMIT_S,
    soft_time_limit=RUN_TIME_LIMIT_S - 60,
)
def run_simulation_task(run_id: int) -> str | None:
    """Execute simulation run `run_id`; returns its final status (None if gone or already taken)."""
    from .services import simulation_execute

    run = simulation_execute(run_id=run_id)
    return None if run is None else run.status

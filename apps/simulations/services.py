"""Simulation runs: start one on a stored cluster, execute it (in a Celery task) with progress.

The replay itself is the placement core's (`apps.placement.sim`); this module only reads the
stored cluster's topology and a trace from the trace folders, and records progress and result.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import close_old_connections, transaction
from django.utils import timezone

from apps.placement.sim import SimConfig, TraceError, read_trace, simulate
from apps.placement.sim.traces import FORMATS
from apps.placement.solvers import POLICIES
from apps.placement.topology import SpecError
from apps.topology.models import Cluster
from apps.topology.services import cluster_topology

from .choices import RunStatus
from .models import SimulationRun

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5  # how often a running replay writes its progress


def trace_folders() -> list[Path]:
    """Folders whose CSV traces may be replayed: the bundled samples, then SIMULATION_TRACE_DIR."""
    folders = [Path(settings.BASE_DIR) / "examples" / "traces"]
    extra = getattr(settings, "SIMULATION_TRACE_DIR", "")
    if extra:
        folders.append(Path(extra))
    return [f for f in folders if f.is_dir()]


def available_traces() -> dict[str, Path]:
    """Trace file name -> path, for the CSV files of the trace folders with a known header (the
    first folder wins a name)."""
    out: dict[str, Path] = {}
    for folder in trace_folders():
        for path in sorted(folder.glob("*.csv")):
            if path.name not in out and _known_format(path):
                out[path.name] = path
    return out


def _known_format(path: Path) -> bool:
    from apps.placement.sim.traces import _HEADERS

    try:
        with open(path, encoding="utf-8") as fh:
            header = {h.strip() for h in fh.readline(4096).split(",")}
    except (OSError, UnicodeDecodeError):
        return False
    return any(_HEADERS[f] <= header for f in FORMATS)


def simulation_start(
    *,
    cluster: Cluster,
    trace: str,
    policies: list[str],
    job_limit: int,
    seed: int = 0,
    load: float | None = None,
    user=None,
    defer: bool = False,
) -> SimulationRun:
    """Record a queued run and queue its execution once the transaction commits (not with
    `defer`: the caller runs `simulation_execute` itself).

    Raises ValidationError naming the field (`trace`, `policies`, `job_limit`, `seed`, `load`)."""
    if trace not in available_traces():
        raise ValidationError({"trace": f"unknown trace {trace[:200]!r}; pick one of the listed traces"})
    if not policies or len(set(policies)) != len(policies) or not set(policies) <= set(POLICIES):
        raise ValidationError({"policies": f"name one or more distinct policies among {', '.join(POLICIES)}"})
    run = SimulationRun(
        cluster=cluster,
        cluster_name=cluster.name,
        trace=trace,
        policies=list(policies),
        job_limit=job_limit,
        seed=seed,
        load=load,
        created_by=user if user is not None and user.is_authenticated else None,
    )
    run.full_clean()
    with transaction.atomic():
        run.save()
        if not defer:
            transaction.on_commit(lambda: queue_simulation(run.pk))
    return run


def queue_simulation(run_id: int) -> None:
    """Run the simulation in the Celery worker, or in a thread in the embedded default (whose
    eager Celery would otherwise hold the web request for the whole replay)."""
    if getattr(settings, "SIMULATIONS_IN_THREAD", False):
        threading.Thread(
            target=_execute_in_thread, args=(run_id,), daemon=True, name=f"simulation-{run_id}"
        ).start()
        return
    from .tasks import run_simulation_task

    run_simulation_task.delay(run_id)


def _execute_in_thread(run_id: int) -> None:
    close_old_connections()
    try:
        simulation_execute(run_id=run_id)
    finally:
        close_old_connections()


def simulation_execute(*, run_id: int, progress=None) -> SimulationRun | None:
    """Replay a queued run and store its result (or its error); None if the run is gone or
    already taken. `progress(policy, done, total)` is called as well, for a terminal's bar."""
    claimed = SimulationRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        return None
    run = SimulationRun.objects.select_related("cluster").get(pk=run_id)
    try:
        result = _replay(run, progress)
    except (TraceError, SpecError, ValueError) as exc:
        _fail(run, " ".join(str(exc).split()))
    except Exception as exc:
        log.exception("simulation %s failed", run_id)
        _fail(run, f"internal error: {type(exc).__name__}")
    else:
        done = run.jobs_total
        SimulationRun.objects.filter(pk=run_id).update(
            status=RunStatus.DONE, result=result, jobs_done=done, finished_at=timezone.now()
        )
    run.refresh_from_db()
    return run


def _fail(run: SimulationRun, message: str) -> None:
    SimulationRun.objects.filter(pk=run.pk).update(
        status=RunStatus.FAILED, error=message[:2000], finished_at=timezone.now()
    )


def _replay(run: SimulationRun, progress) -> dict:
    if run.cluster is None:
        raise ValueError(f"cluster {run.cluster_name!r} no longer exists")
    path = available_traces().get(run.trace)
    if path is None:
        raise ValueError(f"trace {run.trace!r} is no longer in the trace folders")
    topology = cluster_topology(cluster=run.cluster)
    trace = read_trace(str(path), limit=run.job_limit, seed=run.seed)
    if not trace.jobs:
        raise ValueError(f"trace {run.trace!r} holds no job to replay")
    per_policy = len(trace.jobs)
    run.jobs_total = per_policy * len(run.policies)
    SimulationRun.objects.filter(pk=run.pk).update(jobs_total=run.jobs_total, jobs_done=0)
    last = [0.0]

    def report(policy: str, done: int, total: int) -> None:
        if progress is not None:
            progress(policy, done, total)
        now = time.monotonic()
        if now - last[0] < PROGRESS_EVERY_S and done < total:
            return
        last[0] = now
        overall = run.policies.index(policy) * per_policy + done
        SimulationRun.objects.filter(pk=run.pk).update(jobs_done=overall)

    comparison = simulate(
        topology, trace, list(run.policies), seed=run.seed, config=SimConfig(), load=run.load, progress=report
    )
    return comparison.as_dict(series=True)

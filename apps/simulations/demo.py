"""The demo's simulation for `manage.py load_demo`: the first 80 Philly multi-GPU jobs on pod-256
at an offered load of 0.9, under topo and the baselines, run at once so that `make run` shows a
finished comparison on the simulations page."""

from __future__ import annotations

from apps.topology.models import Cluster

from .models import SimulationRun
from .services import simulation_execute, simulation_start

DEMO_CLUSTER = "pod-256"
DEMO_TRACE = "philly_multigpu_first80.csv"
DEMO_POLICIES = ["topo", "tree_best_fit", "first_fit", "naive"]
DEMO_LOAD = 0.9


def load_demo_simulation() -> SimulationRun | None:
    """Record and run the demo simulation unless one already exists (None without the cluster)."""
    cluster = Cluster.objects.filter(name=DEMO_CLUSTER).first()
    if cluster is None:
        return None
    existing = SimulationRun.objects.filter(cluster=cluster, trace=DEMO_TRACE).first()
    if existing is not None:
        return existing
    run = simulation_start(
        cluster=cluster, trace=DEMO_TRACE, policies=DEMO_POLICIES, job_limit=80, load=DEMO_LOAD, defer=True
    )
    return simulation_execute(run_id=run.pk)

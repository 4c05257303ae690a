"""Work, counted rather than timed: the figures a loaded machine cannot make flaky.

- Queries and cache calls per API request: a submission (POST /api/v1/jobs/, plain, with an
  Idempotency-Key and its replay), the job list and a job's detail; and per scheduling cycle
  (Django's CaptureQueriesContext; cache calls through a counting wrapper on the default cache).
  The cycle runs on a worker, as in production: a submission only asks for it, through the
  shared cache that coalesces cycle requests (counted whatever cache the process has).
- Cost-model calls (`costmodel.evaluate`) per topo placement: 8-, 64- and 1,024-GPU jobs on the
  16,384-GPU cluster of bench/placement_speed.py (seeded fragmented free sets, and 8-GPU jobs
  booked one after another as in its placements/s run), and per job a scheduling cycle places.

bench/budgets.json holds a budget per figure; tests/unit/test_work_budgets.py fails when a count
exceeds its budget, or a figure has none. Counts are exact and on SQLite (the unit tests'
database). A budget changes only in a commit that says why.

    .venv/bin/python bench/work_counts.py      # FIGURE lines, then each count against its budget
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = Path(__file__).resolve().parent / "budgets.json"
sys.path.insert(0, str(ROOT))

CLUSTER = {
    "version": 1,
    "name": "work",
    "generate": {
        "shape": "leaf-spine",
        "spines": 2,
        "leaves": 4,
        "nodes_per_leaf": 4,
        "gpus_per_node": 8,
        "gpu_model": "H100",
        "peak_tflops": 989,
        "nvlink_bw_GBps": 450,
        "nic_bw_GBps": 50,
        "nics_per_node": 8,
        "uplink_bw_GBps": 800,
    },
}
CYCLE_JOBS = 12  # jobs queued before the counted cycle (each fits at once)
LIST_JOBS = 20  # jobs on the cluster when the list is read
API_REQUESTS = ("submit", "submit_idempotent", "submit_replay", "get_list", "get_detail")


@contextmanager
def counted_evaluate() -> Iterator[list[int]]:
    """Count calls of the cost model's `evaluate` from every placement module that imported it
    (they call it by their own module-level name); yields a one-element list holding the count."""
    import apps.placement.costmodel as costmodel

    original = costmodel.evaluate
    count = [0]

    def evaluate(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    patched = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("apps.placement") and getattr(m, "evaluate", None) is original
    ]
    for m in patched:
        m.evaluate = evaluate
    try:
        yield count
    finally:
        for m in patched:
            m.evaluate = original


def placement_counts(seed: int = 1, runs: int = 5) -> dict[str, float]:
    """Mean `evaluate` calls per topo placement on the 16,384-GPU cluster (no Django)."""
    import placement_speed as ps

    from apps.placement.solvers import NoFit, place

    topology = ps.cluster("16k", 8, 8, 32)
    place(topology, topology.free_mask(), None, ps.llm_job(8))  # the per-topology indexes
    out: dict[str, float] = {}
    for gpus in (8, 64, 1024):
        job = ps.llm_job(gpus)
        rng = np.random.default_rng(seed)
        frees = [ps.fragment(topology, 0.3, rng) for _ in range(runs)]
        with counted_evaluate() as calls:
            for free in frees:
                assert not isinstance(place(topology, free, None, job), NoFit)
        out[f"evaluate_per_placement.topo_{gpus}_on_16k"] = calls[0] / runs
    job = ps.llm_job(8)
    rng = np.random.default_rng(seed)
    free = topology.free_mask()
    # Booked one after another from an 80%-busy cluster, as placement_speed's placements/s run.
    busy = ps.fragment(topology, 0.8, rng)
    free &= busy
    booked = 0
    with counted_evaluate() as calls:
        while booked < 50:
            result = place(topology, free, None, job)
            free[list(result.gids)] = False
            booked += 1
    out["evaluate_per_placement.topo_8_booked_on_16k"] = calls[0] / booked
    return out


class CountingCache:
    """Calls of the default cache's methods around a block (`calls`): the outermost ones only, so
    a get_many the backend builds from gets is one call, as it is one round trip to Redis."""

    METHODS = ("get", "set", "add", "delete", "incr", "decr", "get_many", "set_many", "delete_many", "touch")

    def __init__(self):
        from django.core.cache import caches

        self.target = caches["default"]
        self.calls = 0
        self.depth = 0

    @contextmanager
    def counting(self) -> Iterator[CountingCache]:
        originals = {name: getattr(self.target, name) for name in self.METHODS}

        def wrap(fn: Callable) -> Callable:
            def counted(*args, **kwargs):
                self.calls += self.depth == 0
                self.depth += 1
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.depth -= 1

            return counted

        for name, fn in originals.items():
            setattr(self.target, name, wrap(fn))
        try:
            yield self
        finally:
            for name in originals:
                delattr(self.target, name)


def _spec(name: str, gpus: int) -> dict:
    return {
        "version": 1,
        "name": name,
        "cluster": "work",
        "gpus": gpus,
        "parallelism": {"tp": gpus, "pp": 1, "dp": 1},
        "step": {"compute_ms": 100},
        "comm": [{"group": "tp", "collective": "allreduce", "bytes": 5e7}] if gpus > 1 else [],
        "estimated_runtime_s": 3600,
    }


def api_counts() -> dict[str, float]:
    """Queries and cache calls per request and per cycle on a fresh cluster "work" (Django set up
    on an empty, migrated database, outside a test transaction)."""
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from apps.api.throttling import FixedWindowThrottle
    from apps.scheduling import cycle, services
    from apps.scheduling.tasks import schedule_cluster_task
    from apps.topology.services import cluster_import
    from topoweb.celery import app as celery_app

    if cache.__class__.__name__ == "LocMemCache":
        cache.clear()  # throttle histories of earlier users with the same id
    cluster = cluster_import(data=CLUSTER)
    user = get_user_model().objects.create_user("work-counts")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    out: dict[str, float] = {}
    counter = CountingCache()

    def count(name: str, call: Callable, status: int) -> object:
        counter.calls = 0
        with CaptureQueriesContext(connection) as queries, counter.counting():
            response = call()
        assert response.status_code == status, (name, response.status_code, response.content[:300])
        out[f"queries.{name}"] = len(queries)
        out[f"cache_calls.{name}"] = counter.calls
        return response

    eager = celery_app.conf.CELERY_TASK_ALWAYS_EAGER
    delay = schedule_cluster_task.delay
    coalescing = cycle.coalescing
    # The throttles' windows do not turn over between the requests counted: the first request of
    # a new window creates its counter (one cache call more), which a slow run met at random.
    started = time.time()
    FixedWindowThrottle.timer = staticmethod(lambda: started)
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = False  # the cycle runs on a worker
    schedule_cluster_task.delay = lambda *args, **kwargs: None
    # As in production (a broker and a shared cache), whatever cache this process has.
    cycle.coalescing = lambda: True
    try:
        # The first request loads the cluster's topology and the URLconf: not counted.
        assert api.post("/api/v1/jobs/", _spec("warm", 1), format="json").status_code == 201
        count("submit", lambda: api.post("/api/v1/jobs/", _spec("plain", 2), format="json"), 201)
        key = {"HTTP_IDEMPOTENCY_KEY": "work-counts-1"}
        count(
            "submit_idempotent",
            lambda: api.post("/api/v1/jobs/", _spec("keyed", 4), format="json", **key),
            201,
        )
        count(
            "submit_replay", lambda: api.post("/api/v1/jobs/", _spec("keyed", 4), format="json", **key), 201
        )
        for i in range(CYCLE_JOBS - 3):
            services.job_submit(user=user, spec=_spec(f"queued-{i}", 1 + i % 4))
        with CaptureQueriesContext(connection) as queries, counted_evaluate() as calls:
            record = services.schedule_cluster(cluster=cluster)
        assert record.placed == CYCLE_JOBS, record.placed
        out["queries.cycle"] = len(queries)
        out["evaluate_per_placement.cycle"] = calls[0] / record.placed
        for i in range(LIST_JOBS - CYCLE_JOBS):
            services.job_submit(user=user, spec=_spec(f"listed-{i}", 1))
        placed = services.Job.objects.filter(placed_at__isnull=False).order_by("id").first()
        count("get_list", lambda: api.get("/api/v1/jobs/?page_size=50"), 200)
        count("get_detail", lambda: api.get(f"/api/v1/jobs/{placed.pk}/"), 200)
    finally:
        celery_app.conf.CELERY_TASK_ALWAYS_EAGER = eager
        schedule_cluster_task.delay = delay
        cycle.coalescing = coalescing
        del FixedWindowThrottle.timer  # DRF's again (time.time)
    return out


def over_budget(counts: dict[str, float], budgets: dict[str, dict]) -> list[str]:
    """Each count above its budget, and each count without one, as a sentence."""
    problems = []
    for name, value in sorted(counts.items()):
        if name not in budgets:
            problems.append(f"{name} = {value:g} has no budget in bench/budgets.json")
        elif value > budgets[name]["budget"]:
            problems.append(f"{name} = {value:g} is over its budget of {budgets[name]['budget']:g}")
    return problems


def load_budgets() -> dict[str, dict]:
    """bench/budgets.json: figure -> {"budget": number, "why": text}."""
    return json.loads(BUDGETS.read_text())["budgets"]


def main() -> int:
    from figures import figure

    with tempfile.TemporaryDirectory(prefix="topoweb-work-") as tmp:
        os.environ.update(
            DATABASE_URL=f"sqlite:///{tmp}/work.sqlite3",
            DJANGO_SETTINGS_MODULE="topoweb.settings",
            TOPOWEB_TESTING="1",
            TOPOWEB_LOG_LEVEL="WARNING",
        )
        for name in ("CELERY_BROKER_URL", "CACHE_URL"):
            os.environ.pop(name, None)
        import django
        from django.core.management import call_command

        django.setup()
        from django.test.utils import setup_test_environment

        setup_test_environment()  # the test client's host is allowed, as in the unit tests
        call_command("migrate", verbosity=0)
        counts = {**placement_counts(), **api_counts()}
        from django.db import connections

        connections.close_all()
    for name, value in counts.items():
        figure(name, value, "calls" if name.startswith(("evaluate", "cache")) else "queries")
    budgets = load_budgets()
    problems = over_budget(counts, budgets)
    for name, value in counts.items():
        budget = budgets.get(name, {}).get("budget")
        print(f"{name:<52}{value:>8g}  budget {budget if budget is not None else '-'}")
    for p in problems:
        print("OVER:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

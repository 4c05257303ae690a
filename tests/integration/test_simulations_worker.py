"""A simulation run started on Postgres goes through Redis to a real Celery worker, which writes
its progress and result."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.placement.topology import read_spec_file
from apps.simulations.choices import RunStatus
from apps.simulations.models import SimulationRun
from apps.simulations.services import simulation_start
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES, celery_workers, wait_for
from topoweb.celery import app as celery_app

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres", "require_redis")]


@pytest.fixture
def sim_worker(transactional_db, tmp_path):
    with celery_workers(1, tmp_path) as names:
        yield names


def test_a_simulation_runs_in_the_worker_and_reports_progress(sim_worker):
    assert connection.vendor == "postgresql"
    assert not celery_app.conf.task_always_eager, "the task must go through Redis to the worker"
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "pod-256.yaml"))
    run = simulation_start(
        cluster=cluster,
        trace="philly_multigpu_first80.csv",
        policies=["topo", "naive"],
        job_limit=80,
        load=0.9,
    )
    seen = set()

    def finished():
        row = SimulationRun.objects.defer("result").get(pk=run.pk)
        seen.add(row.status)
        return row.status in (RunStatus.DONE, RunStatus.FAILED)

    wait_for(finished, timeout_s=120, what="the worker to finish the simulation")
    run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.error
    assert run.jobs_done == run.jobs_total == 160
    assert set(run.result["policies"]) == {"topo", "naive"}
    assert RunStatus.QUEUED in seen or RunStatus.RUNNING in seen

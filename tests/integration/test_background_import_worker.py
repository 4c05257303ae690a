"""The largest supported cluster (131,072 GPUs) imported in the background: the request answers
at once, a real Celery worker on Redis writes the cluster on Postgres, and its progress shows."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from apps.topology.models import ClusterImport, Gpu
from apps.topology.services import cluster_import_queue
from tests.integration.test_scheduling_postgres import celery_workers, wait_for
from topoweb.celery import app as celery_app

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres", "require_redis")]

LARGEST = {
    "version": 1,
    "name": "largest",
    "generate": {
        "shape": "leaf-spine",
        "spines": 16,
        "leaves": 512,
        "nodes_per_leaf": 32,
        "gpus_per_node": 8,
        "nics_per_node": 8,
        "gpu_model": "H100",
        "peak_tflops": 989,
        "nvlink_bw_GBps": 450,
        "nic_bw_GBps": 50,
        "uplink_bw_GBps": 400,
    },
}


@pytest.fixture
def import_worker(transactional_db, tmp_path):
    with celery_workers(1, tmp_path) as names:
        yield names


def test_a_131072_gpu_import_completes_as_a_task(import_worker):
    assert connection.vendor == "postgresql"
    assert not celery_app.conf.task_always_eager, "the task must go through Redis to the worker"
    t0 = time.monotonic()
    job = cluster_import_queue(data=LARGEST, replace=False)
    queued_s = time.monotonic() - t0
    stages = set()

    def finished():
        row = ClusterImport.objects.defer("spec").get(pk=job.pk)
        stages.add(row.stage)
        return row.status in (ClusterImport.Status.DONE, ClusterImport.Status.FAILED)

    wait_for(finished, timeout_s=900, what="the worker to finish the import")
    job.refresh_from_db()
    assert job.status == ClusterImport.Status.DONE, job.errors
    assert job.progress == 1.0 and job.spec is None
    assert Gpu.objects.filter(node__cluster=job.cluster).count() == 131_072
    assert queued_s < 5, f"queueing took {queued_s:.1f} s"
    print(f"131,072-GPU background import: {time.monotonic() - t0:.0f} s; stages seen {sorted(stages)}")

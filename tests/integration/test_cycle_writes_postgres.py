"""A cycle's writes on Postgres: the jobs it places are set placing by one UPDATE from unnest()
of every job's values, which writes what one UPDATE per job (the statement elsewhere) writes."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import DataError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.placement.topology import read_spec_file
from apps.scheduling import lifecycle
from apps.scheduling.models import Allocation, Job
from apps.topology import services as topology_services
from tests.integration.test_scheduling_postgres import EXAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_postgres"), pytest.mark.django_db]


def fields(i: int) -> dict:
    """Prediction fields of the i-th job: nulls, empty and quoted JSON, a borrowed one."""
    return {
        "placed_policy": "topo",
        "predicted_comm_ms": 1.5 * i,
        "predicted_step_ms": 100.0 + i,
        "predicted_mfu": None if i == 0 else 0.25 * i,
        "predicted": {"tp": {"comm_ms": i, "note": 'it\'s "quoted"'}} if i else None,
        "flows": {f"leaf-{i}": 2.5 * i} if i else {},
        "borrowed": i == 2,
    }


def test_placed_jobs_are_one_update_from_unnest_writing_what_one_update_per_job_writes(monkeypatch):
    cluster = topology_services.cluster_import(data=read_spec_file(EXAMPLES / "case-4-4.yaml"))
    owner = get_user_model().objects.create_user("placed")
    batched, each = (
        [
            Job.objects.create(name=f"{side}-{i}", cluster=cluster, owner=owner, spec={}, gpus=1)
            for i in range(4)
        ]
        for side in ("batched", "each")
    )
    now = timezone.now()
    with CaptureQueriesContext(connection) as ctx:
        lifecycle._mark_placed(updates=[(job.pk, fields(i)) for i, job in enumerate(batched)], now=now)
    (update,) = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith('UPDATE "scheduling_job"')]
    assert "unnest(" in update
    with monkeypatch.context() as m:
        m.setattr(connection, "vendor", "elsewhere")  # one statement per job
        lifecycle._mark_placed(updates=[(job.pk, fields(i)) for i, job in enumerate(each)], now=now)
    columns = [*lifecycle.PLACED_FIELDS, "generation"]

    def written(jobs: list[Job]) -> list[dict]:
        return [Job.objects.values(*columns).get(pk=job.pk) for job in jobs]

    assert written(batched) == written(each)
    first, second = written(batched)[:2]
    assert (first["status"], first["placed_at"], first["generation"]) == ("placing", now, 1)
    assert (first["predicted"], first["flows"], first["predicted_mfu"]) == (None, {}, None)
    assert second["predicted"] == {"tp": {"comm_ms": 1, "note": 'it\'s "quoted"'}}
    assert [job["borrowed"] for job in written(batched)] == [False, False, True, False]


def test_an_allocation_value_longer_than_its_column_is_refused_not_cut_short():
    """The allocations' arrays are cast to the columns' types without their lengths: a value too
    long for its column fails the INSERT (as one INSERT per row would), never lands truncated."""
    row = Allocation(
        job_id=1, rank=0, gpu_id=1, node_name="n" * 101, gpu_index=0, nic_name="nic", live=True,
        generation=0, created_at=timezone.now(),
    )  # fmt: skip
    with pytest.raises(DataError, match="too long"), transaction.atomic():
        lifecycle._insert_allocations([row])
    assert not Allocation.objects.exists()
